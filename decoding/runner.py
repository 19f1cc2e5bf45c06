"""Run a strategy to completion (or until stopped) and collect its events into a Trace."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decoding.core.config import (
    AUTO_COST,
    BaseConfig,
    BeamConfig,
    DSparkConfig,
    GreedyConfig,
    SampleConfig,
    SpeculativeConfig,
)
from decoding.core.errors import ConfigError, StepError, check
from decoding.core.formulas import cut_at_eos
from decoding.core.trace import SCHEMA_VERSION, DraftingInfo, Stats, Trace
from decoding.core.trace_totals import emitted_ids, target_forwards
from decoding.drafters.resolve import planned_drafting as planned_sources
from decoding.runtime.engine_thread import ENGINE
from decoding.runtime.models import LM, free_device_memory, is_out_of_memory
from decoding.strategies import beam, dspark, greedy, sampling, speculative


@dataclass(frozen=True)
class Strategy:
    name: str
    config_cls: type
    decode: Callable                                   # (lm, prompt_ids, config, *, generator, forced)
    output_ids: Callable[[Sequence], list[int]]        # events -> new token ids
    extra_stats: Callable[[Sequence], dict] | None = None
    drafting: Callable | None = None                   # (lm, config) -> DraftingInfo: the sources a run will use


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> None:
    STRATEGIES[strategy.name] = strategy


register(Strategy("greedy", GreedyConfig, greedy.decode, emitted_ids))
register(Strategy("sample", SampleConfig, sampling.decode, emitted_ids))
register(Strategy("beam", BeamConfig, beam.decode, beam.output_ids))
register(Strategy("speculative", SpeculativeConfig, speculative.decode, emitted_ids, speculative.spec_stats,
                  planned_sources))
register(Strategy("dspark", DSparkConfig, dspark.decode, emitted_ids, dspark.dspark_stats, planned_sources))


def planned_drafting(lm: LM, config: BaseConfig) -> DraftingInfo | None:
    """Which sources a run of `config` on `lm` will use and why, as its trace will record them (`drafting`),
    without loading a drafter or running the model (decoding.drafters.resolve, the resolver both strategies
    run with); None for a strategy without drafting."""
    drafting = strategy_for(config).drafting
    return drafting(lm, config) if drafting is not None else None


def strategy_for(config: BaseConfig) -> Strategy:
    check(config.strategy in STRATEGIES, "strategy", config.strategy,
          f"choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[config.strategy]


def check_inputs(lm: LM, prompt_ids: Sequence[int], max_new_tokens: int, forced: Sequence[int] = ()) -> None:
    """Refuse, naming the parameter, what no strategy can run: an empty prompt, one that fills the
    model's context, max_new_tokens beyond the room left, forced token ids outside the vocabulary."""
    check(len(prompt_ids) > 0, "prompt", "", "must not be empty")
    context = lm.context_length
    check(len(prompt_ids) < context, "prompt", f"<{len(prompt_ids)} tokens>",
          f"is longer than the model's context of {context} tokens")
    room = context - len(prompt_ids)
    check(max_new_tokens <= room, "max_new_tokens", max_new_tokens,
          f"goes beyond the model's context of {context} tokens: the prompt has {len(prompt_ids)}, "
          f"so at most {room} new tokens fit")
    bad = [t for t in forced if not (0 <= int(t) < lm.vocab_size)]
    check(not bad, "forced_ids", bad[:3], f"token ids must be in [0, {lm.vocab_size})")


def iterate(lm: LM, prompt_ids: Sequence[int], config: BaseConfig, *, forced: Sequence[int] = (),
            **strategy_kwargs):
    """The strategy's event generator, seeded from config.seed with an explicit CPU generator.
    `strategy_kwargs` go to the strategy's decode (speculative's and DSpark's drafter= and memory=). The decode
    call itself runs on the engine thread: what it checks and loads before the first event (the model's
    architecture, the drafter its name needs) fails here, before any step, as bad input."""
    check_inputs(lm, prompt_ids, config.max_new_tokens, forced)
    generator = torch.Generator(device="cpu").manual_seed(config.seed)
    return ENGINE.steps(ENGINE.call(strategy_for(config).decode, lm, list(prompt_ids), config, generator=generator,
                                    forced=until_eos(forced, lm.eos_ids), **strategy_kwargs))


def until_eos(forced: Sequence[int], eos_ids) -> list[int]:
    """The forced tokens up to and including the first EOS: an answer ends there, forced or not."""
    return list(cut_at_eos(forced, eos_ids))


def run(lm: LM, prompt_ids: Sequence[int], config: BaseConfig, *, prompt_text: str = "",
        forced: Sequence[int] = (), should_stop: Callable[[], bool] | None = None,
        on_event: Callable[[object], None] | None = None, **strategy_kwargs) -> Trace:
    """Collect a whole run into a Trace. A run stopped by `should_stop`, or one that fails mid-way,
    still returns the trace so far (stop_reason 'stopped' or 'error' with the message). Ctrl-C
    (KeyboardInterrupt) raises RunInterrupted carrying the trace so far (stop_reason 'stopped')."""
    events: list = []
    stop_reason, error, interrupted = "max_new_tokens", None, False
    start = time.perf_counter()
    gen = iterate(lm, prompt_ids, config, forced=forced, **strategy_kwargs)
    try:
        for event in gen:
            events.append(event)
            if on_event is not None:
                on_event(event)
            if should_stop is not None and should_stop():
                stop_reason = "stopped"
                break
    except RUN_ERRORS as err:
        stop_reason, error = "error", error_line(err, config, step=len(events))
    except KeyboardInterrupt:
        stop_reason, interrupted = "stopped", True
    wall = time.perf_counter() - start
    trace = assemble(lm, prompt_ids, config, events, prompt_text=prompt_text, forced=until_eos(forced, lm.eos_ids),
                     end=RunEnd(wall, stop_reason, error))
    if interrupted:
        raise RunInterrupted(trace)
    return trace


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during `run` or `run_lockstep`: still a KeyboardInterrupt, carrying what was recorded until
    then in `result` (run: the Trace; run_lockstep: label -> Trace), each with stop_reason 'stopped'."""

    def __init__(self, result):
        super().__init__("interrupted")
        self.result = result


RUN_ERRORS = (ConfigError, RuntimeError, ValueError)   # a run that fails mid-way keeps its trace so far
OOM_KNOBS = ("max_new_tokens", "num_beams", "gamma", "gamma_max", "budget", "top_k_candidates")


# ------------------------------------------------------------------ several strategies in lockstep
@dataclass
class _Lane:
    config: BaseConfig
    gen: Iterator | None
    events: list = field(default_factory=list)
    busy_s: float = 0.0                    # time spent in this lane's own steps
    stop_reason: str = "max_new_tokens"
    error: str | None = None
    live: bool = True


def run_lockstep(lm: LM, prompt_ids: Sequence[int], lanes: Mapping[str, tuple[BaseConfig, dict]], *,
                 prompt_text: str = "", forced: Sequence[int] = (), should_stop: Callable[[], bool] | None = None,
                 on_event: Callable[[str, object], None] | None = None, warm: bool = True) -> dict[str, Trace]:
    """Several strategies on one prompt, advanced in lockstep: each turn every live lane takes one step
    (one event: a token, a beam step, a speculative or DSpark round) in the lanes' order, so that a slow
    spell of the machine falls on all of them alike. `lanes` maps a label to (config, strategy kwargs).
    A lane's wall_s is the time of its own steps. A lane refused before its first step (bad input) gets
    a trace with no steps and the error; one that fails mid-way keeps its steps; the others go on.
    Ctrl-C raises RunInterrupted carrying every lane's trace so far (the live ones 'stopped')."""
    state = {label: _start(lm, prompt_ids, config, forced, kwargs) for label, (config, kwargs) in lanes.items()}
    if warm and any(lane.live for lane in state.values()):
        ENGINE.call(lm.warm_up, prompt_ids)
    try:
        _turns(state, should_stop, on_event)
        interrupted = False
    except KeyboardInterrupt:
        _stop_live(state)
        interrupted = True
    forced = until_eos(forced, lm.eos_ids)
    traces = {label: assemble(lm, prompt_ids, lane.config, lane.events, prompt_text=prompt_text, forced=forced,
                              end=RunEnd(lane.busy_s, lane.stop_reason, lane.error))
              for label, lane in state.items()}
    if interrupted:
        raise RunInterrupted(traces)
    return traces


def _turns(state: dict[str, _Lane], should_stop, on_event) -> None:
    """Turns of one step per live lane until every lane has ended or `should_stop` says so."""
    while any(lane.live for lane in state.values()):
        for label, lane in state.items():
            event = _advance(lane) if lane.live else None
            if event is not None and on_event is not None:
                on_event(label, event)
        if should_stop is not None and should_stop():
            _stop_live(state)


def _stop_live(state: dict[str, _Lane]) -> None:
    for lane in (lane for lane in state.values() if lane.live):
        lane.live, lane.stop_reason = False, "stopped"


def _start(lm: LM, prompt_ids: Sequence[int], config: BaseConfig, forced: Sequence[int], kwargs: dict) -> _Lane:
    try:
        return _Lane(config, iterate(lm, prompt_ids, config, forced=forced, **kwargs))
    except ConfigError as err:
        return _Lane(config, None, stop_reason="error", error=str(err), live=False)


def _advance(lane: _Lane):
    """The lane's next event (None when it has ended: done, or failed with its error recorded)."""
    start = time.perf_counter()
    try:
        event = next(lane.gen)
    except StopIteration:
        lane.live = False
        return None
    except RUN_ERRORS as err:
        lane.live, lane.stop_reason = False, "error"
        lane.error = error_line(err, lane.config, step=len(lane.events))
        return None
    finally:
        lane.busy_s += time.perf_counter() - start
    lane.events.append(event)
    return event


def error_line(err: Exception, config: BaseConfig, step: int) -> str:
    """The one-line message for an error that ended a run at event `step`."""
    if isinstance(err, StepError):
        return err.line(step)
    if is_out_of_memory(err):
        free_device_memory()
        return oom_line(err, config, step)
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def oom_line(err: Exception, config: BaseConfig, step: int) -> str:
    """What ran out and what to reduce, with the config's current values."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
    tree = getattr(config, "select", "") == "tree"
    knobs = ", ".join(f"{name}={getattr(config, name)}" for name in OOM_KNOBS
                      if getattr(config, name, 0) and (name != "budget" or tree))
    return (f"memory: out of memory at step {step} ({first}); reduce {knobs}, "
            "or use dtype float16 or bfloat16, or a smaller model")


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: its wall time, why it stopped, and the error line when it failed."""

    wall_s: float
    stop_reason: str
    error: str | None = None


def assemble(lm: LM, prompt_ids: Sequence[int], config: BaseConfig, events: Iterable, *,
             prompt_text: str, forced: Sequence[int], end: RunEnd) -> Trace:
    """The Trace of a run's events: output ids, stats and the natural stop reason."""
    events, wall_s, stop_reason = tuple(events), end.wall_s, end.stop_reason
    strategy = strategy_for(config)
    out = [int(t) for t in strategy.output_ids(events)]
    if stop_reason == "max_new_tokens":
        stop_reason = _natural_stop(lm, out, config, len(prompt_ids))
    extra = strategy.extra_stats(events) if strategy.extra_stats else {}
    stats = Stats(new_tokens=len(out), target_forwards=target_forwards(events), wall_s=round(wall_s, 6),
                  tokens_per_s=round(len(out) / wall_s, 3) if wall_s > 0 else 0.0, **extra)
    return Trace(schema_version=SCHEMA_VERSION, strategy=config.strategy, config=recorded_config(config),
                 model=lm.describe(), prompt_text=prompt_text, prompt_ids=tuple(int(t) for t in prompt_ids),
                 forced_ids=tuple(int(t) for t in forced), output_ids=tuple(out), text=lm.decode(out),
                 steps=events, stats=stats, stop_reason=stop_reason, error=end.error)


def recorded_config(config: BaseConfig) -> dict:
    """The config as a trace records it: a cost-table file by its name alone, as `cost_source` names it, so
    that a trace carries no folder of the machine that ran it (an app's upload lives under its cache)."""
    out = config.to_dict()
    table = out.get("cost_table")
    if isinstance(table, str) and table != AUTO_COST:
        out["cost_table"] = Path(table).name
    return out


def _natural_stop(lm: LM, out: list[int], config: BaseConfig, prompt_len: int) -> str:
    if out and out[-1] in lm.eos_ids:
        return "eos"
    if len(out) >= config.max_new_tokens:
        return "max_new_tokens"
    if prompt_len + len(out) >= lm.context_length:
        return "context"
    return "eos"
