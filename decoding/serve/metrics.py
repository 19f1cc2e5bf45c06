"""/metrics in Prometheus' text format (prometheus-client), under vLLM's names and meanings, so that a
dashboard made for vLLM reads them: the latency histograms of each request (queue, time to first token,
inter-token latency, end to end) and the speculative counters, with vLLM's labels (model_name, engine)
and one more, `strategy`. vLLM's counters count per drafting round: a draft is one round that proposed
tokens, draft tokens what it proposed (DSpark: the nodes of its chain or tree), accepted tokens the
drafts accepted (the bonus or residual token not counted), and accepted per position k (from 0) the
rounds whose first k+1 drafts were all accepted."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LABELS = ("model_name", "engine", "strategy")
# Seconds, for a CPU where one token takes tens of milliseconds and a queue can hold a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                   5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class SpecCounts:
    """A run's drafting rounds counted as vLLM counts them."""

    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]


def _round(step) -> tuple[int, int] | None:
    """(drafted, accepted) of a drafting round; None for any other step (a token, the DSpark prefill)."""
    if step.kind == "spec_round":
        return step.gamma, step.accepted
    if step.kind == "dspark_round" and not step.prefill:
        return len(step.nodes), len(step.accepted_path)
    return None


def spec_counts(steps: Sequence) -> SpecCounts:
    rounds = [r for r in map(_round, steps) if r is not None and r[0] > 0]
    per_pos = [0] * max((d for d, _ in rounds), default=0)
    for _, accepted in rounds:
        for k in range(accepted):
            per_pos[k] += 1
    return SpecCounts(len(rounds), sum(d for d, _ in rounds), sum(a for _, a in rounds), tuple(per_pos))


class ServeMetrics:
    def __init__(self, model_name: str, waiting: Callable[[], int], running: Callable[[], int]):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        hist = self._histogram
        self.queue = hist("vllm:request_queue_time_seconds", "Time a request waited in the queue, in seconds.")
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (from arrival), in seconds.")
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between two outputs of a request, in seconds.")
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency (arrival to last token), "
                                                            "in seconds.")
        self.success = Counter("vllm:request_success", "Requests finished.", [*LABELS, "finished_reason"],
                               registry=self.registry)
        self.generation = self._counter("vllm:generation_tokens", "Tokens generated.")
        self.prompt = self._counter("vllm:prompt_tokens", "Prompt tokens read.")
        self.drafts = self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted = self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                               [*LABELS, "position"], registry=self.registry)
        self._gauge("vllm:num_requests_waiting", "Requests waiting in the queue.", waiting)
        self._gauge("vllm:num_requests_running", "Requests decoding now.", running)

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(name, doc, LABELS, buckets=LATENCY_BUCKETS, registry=self.registry)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, LABELS, registry=self.registry)

    def _gauge(self, name: str, doc: str, read: Callable[[], int]) -> None:
        gauge = Gauge(name, doc, ["model_name", "engine"], registry=self.registry)
        gauge.labels(self.model_name, "0").set_function(read)

    def observe(self, strategy: str, timing: dict, finished: str, tokens: tuple[int, int], steps: Sequence) -> None:
        """One finished request: its timing (worker.Timeline.summary), finish reason, (prompt, generated)
        token counts and its trace's steps."""
        labels = (self.model_name, "0", strategy)
        self.queue.labels(*labels).observe(timing["queue_s"])
        if timing["ttft_s"] is not None:
            self.ttft.labels(*labels).observe(timing["ttft_s"])
        for gap in timing["itl_s"]:
            self.itl.labels(*labels).observe(gap)
        self.e2e.labels(*labels).observe(timing["e2e_s"])
        self.success.labels(*labels, finished).inc()
        self.prompt.labels(*labels).inc(tokens[0])
        self.generation.labels(*labels).inc(tokens[1])
        self._observe_spec(labels, spec_counts(steps))

    def _observe_spec(self, labels: tuple, counts: SpecCounts) -> None:
        if not counts.drafts:
            return
        self.drafts.labels(*labels).inc(counts.drafts)
        self.draft_tokens.labels(*labels).inc(counts.draft_tokens)
        self.accepted.labels(*labels).inc(counts.accepted)
        for k, n in enumerate(counts.accepted_per_pos):
            self.per_pos.labels(*labels, str(k)).inc(n)

    def text(self) -> bytes:
        return generate_latest(self.registry)
