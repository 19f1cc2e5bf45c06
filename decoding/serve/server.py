"""What the routes share: the model, the server's settings, the queue, the metrics and the request log;
how a checked body becomes a job, how a job decodes on the engine thread, and how a finished one is
recorded."""
from __future__ import annotations

import argparse
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field

from decoding.core import trace as trace_mod
from decoding.core.errors import ConfigError
from decoding.runner import check_inputs, run
from decoding.runtime.files import CacheWarning
from decoding.runtime.models import LM, check_text
from decoding.serve import settings
from decoding.serve.body import CHAT, Asked
from decoding.serve.metrics import ServeMetrics
from decoding.serve.replies import finish_reason
from decoding.serve.text import answer_ids
from decoding.serve.trace_log import TraceLog
from decoding.serve.worker import Job, Outbox, Timeline, Worker, event_ids


class NotServed(ConfigError):
    """A request for another model than the one served (404)."""


def has_chat_template(lm: LM) -> bool:
    return bool(getattr(lm.tokenizer, "chat_template", None))


def chat_ids(lm: LM, messages: tuple[tuple[str, str], ...]) -> list[int]:
    """The conversation in the tokenizer's chat template with the assistant's generation prompt, as
    `python -m decoding run` encodes its one user turn; the texts joined by blank lines without a template."""
    for i, (_, text) in enumerate(messages):
        check_text(text, f"messages[{i}].content")
    if not has_chat_template(lm):
        return lm.encode("\n\n".join(text for _, text in messages), chat_template=False)
    ids = lm.tokenizer.apply_chat_template([{"role": r, "content": t} for r, t in messages],
                                           add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _named(err: ConfigError, named: dict) -> ConfigError:
    """`err` naming the field the client gave (max_tokens) rather than the flag that holds it."""
    return type(err)(named[err.param], err.value, err.expected) if err.param in named else err


@dataclass
class Server:
    lm: LM
    args: argparse.Namespace           # the serve command's flags: the server's strategy and settings
    rules: settings.Rules
    served_name: str
    log: TraceLog
    worker: Worker = field(init=False)
    metrics: ServeMetrics = field(init=False)
    _loaded: dict = field(default_factory=dict)      # what a strategy needs loaded, by draft model
    # One encoding at a time: a fast tokenizer's settings change on each call, and two threads doing that at
    # once can fail ("Already borrowed").
    _encoding: threading.Lock = field(default_factory=threading.Lock)
    started: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.worker = Worker(self.decode, self.record, self.args.max_waiting)
        self.metrics = ServeMetrics(self.served_name, lambda: self.worker.waiting, lambda: self.worker.running)

    def job(self, asked: Asked, outbox: Outbox, arrived: float) -> Job:
        """The request's job, its settings and prompt checked (ConfigError: one line)."""
        if asked.model != self.served_name:
            raise NotServed("model", asked.model, f"is not served here; this server serves {self.served_name!r}")
        try:
            overrides = settings.with_openai(self.args, asked.openai, asked.own)
            config = settings.request_config(self.args, self.rules, overrides)
            with self._encoding:
                ids = (chat_ids(self.lm, asked.messages) if asked.kind == CHAT
                       else self.lm.encode(asked.prompt, chat_template=False))
            check_inputs(self.lm, ids, config.max_new_tokens)
        except ConfigError as err:
            raise _named(err, dict(asked.named)) from None
        text = asked.prompt if asked.kind != CHAT else self.lm.decode(ids)
        prefix = "chatcmpl" if asked.kind == CHAT else "cmpl"
        return Job(f"{prefix}-{uuid.uuid4().hex[:24]}", ids, config, text, outbox, Timeline(arrived))

    def decode(self, job: Job):
        """On the engine thread: the request's run, each step's new tokens sent to its outbox."""
        kwargs = self._strategy_kwargs(job.config)
        trace = run(self.lm, job.ids, job.config, prompt_text=job.prompt_text, should_stop=job.stop.is_set,
                    on_event=lambda event: self._tokens(job, event_ids(event)), **kwargs)
        if trace.error and not trace.steps:          # refused before its first step: bad input
            raise ConfigError.from_line(trace.error)
        if not job.timeline.tokens and trace.output_ids:   # beam search: the answer comes at the end
            self._tokens(job, list(trace.output_ids))
        return trace

    def _tokens(self, job: Job, ids: list[int]) -> None:
        if ids:
            job.timeline.tokens.append(time.perf_counter())
            job.outbox.put(("tokens", ids))

    def _strategy_kwargs(self, config) -> dict:
        """What the strategy needs loaded (speculative decoding's draft model), loaded once per draft."""
        key = (config.strategy, getattr(config, "draft_model", None))
        if key not in self._loaded:
            self._loaded[key] = self.rules.strategy_kwargs(config, self.args, self.lm)
        return self._loaded[key]

    def answer_text(self, trace) -> str:
        return self.lm.decode(answer_ids(trace.output_ids, self.lm.eos_ids))

    def extra(self, job: Job) -> dict:
        """What a reply says beyond OpenAI's fields: the strategy and the request's timing."""
        return {"strategy": job.config.strategy, "timing": job.timeline.summary()}

    def record(self, job: Job, trace) -> None:
        """A finished request into the metrics and the request log (a failed write: one warning line)."""
        timing, finished = job.timeline.summary(), finish_reason(trace.stop_reason)
        counts = (len(job.ids), len(trace.output_ids))
        self.metrics.observe(job.config.strategy, timing, finished, counts, trace.steps)
        record = {"id": job.request_id, "model": self.served_name, "strategy": job.config.strategy,
                  "finish_reason": finished, "prompt_tokens": counts[0], "completion_tokens": counts[1],
                  "arrived_unix_s": round(time.time() - (time.perf_counter() - job.timeline.arrived), 3),
                  "timing": timing, "trace": trace_mod.to_dict(trace)}
        try:
            self.log.add(job.request_id, record)
        except OSError as err:
            warnings.warn(CacheWarning(f"request log: {err.strerror or err}; the request was served"), stacklevel=1)
