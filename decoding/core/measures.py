"""The Lab's measurements as plain data: what to measure (frozen, validated configs) and what one point
measured (frozen events). No torch, so the app and notebooks can read them; decoding.lab measures them."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from decoding.core.errors import check
from decoding.core.formulas import percentile

MAX_LAB_TOKENS = 256          # most new tokens in one measured forward
MAX_LAB_BATCH = 256           # most sequences in one measured forward
FEW_TOKENS = (1, 2, 3, 5, 9, 17)           # n = γ + 1 for γ = 1, 2, 4, 8, 16
ALL_TOKENS = tuple(range(1, 18)) + (24, 33, 48, 64)
FEW_BATCHES = (1, 8)
ALL_BATCHES = (1, 2, 4, 8, 16, 32, 64)
THROUGHPUT_BATCHES = (1, 4, 16)


def check_points(param: str, values, most: int) -> tuple[int, ...]:
    """`values` as a sorted tuple of distinct integers in [1, most], or ConfigError naming `param`."""
    ok = isinstance(values, (tuple, list)) and len(values) > 0 and all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most for v in values)
    check(ok, param, values, f"must be a non-empty list of integers in [1, {most}]")
    return tuple(sorted(set(values)))


def check_count(param: str, value, most: int) -> None:
    check(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most, param, value,
          f"must be an integer in [1, {most}]")


@dataclass(frozen=True)
class CostConfig:
    tokens: tuple[int, ...] = FEW_TOKENS     # new tokens per forward (one sequence)
    batches: tuple[int, ...] = FEW_BATCHES   # sequences per forward (one new token each)
    prefix_tokens: int = 32                  # tokens cached before every timed forward
    repeats: int = 3                         # timed forwards per point (the median is shown)

    def __post_init__(self):
        object.__setattr__(self, "tokens", check_points("tokens", self.tokens, MAX_LAB_TOKENS))
        object.__setattr__(self, "batches", check_points("batches", self.batches, MAX_LAB_BATCH))
        check_count("prefix_tokens", self.prefix_tokens, 4096)
        check_count("repeats", self.repeats, 50)

    @property
    def points(self) -> int:
        """Events `measure_cost` yields: the shape, the rates, then one per point."""
        return 2 + len(self.tokens) + len(self.batches)


@dataclass(frozen=True)
class DeviceRates:
    bytes_per_s: float       # reading a large float32 tensor once (a sum over it), best of the repeats
    flops_per_s: float       # the model's largest layer weight times many rows, best of the repeats
    read_bytes: int          # the tensor read
    product: str             # what the FLOP rate was measured on
    bytes_per_s_low: float | None = None     # the slowest repeat's rates: with the best, the spread
    flops_per_s_low: float | None = None


@dataclass(frozen=True)
class ForwardTime:
    axis: str                # "tokens": one sequence, n new tokens; "batch": n sequences, one new token each
    n: int
    times_ms: tuple[float, ...]

    @property
    def ms(self) -> float:
        return statistics.median(self.times_ms)


@dataclass(frozen=True)
class ThroughputConfig:
    batches: tuple[int, ...] = THROUGHPUT_BATCHES
    steps: int = 5                       # timed decoding steps per batch size (after one untimed step)

    def __post_init__(self):
        object.__setattr__(self, "batches", check_points("batches", self.batches, MAX_LAB_BATCH))
        check_count("steps", self.steps, 256)


@dataclass(frozen=True)
class BatchDecode:
    batch: int
    step_ms: tuple[float, ...]     # each timed step: one forward over b new tokens and the argmax
    tokens: tuple[int, ...]        # the first row's greedy tokens (the prefill's, the untimed step's, the timed)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.batch * len(self.step_ms) / sum(self.step_ms)

    def latency_ms(self, q: float) -> float:
        """The q-th percentile of the time a request waits for its next token (one step)."""
        return percentile(self.step_ms, q)


# ---------------------------------------------------------------- the losslessness lab
LOSSLESS_RULES = ("speculative", "dspark", "lossy", "retrospective")
LOSSLESS = {"speculative": True, "dspark": True, "lossy": False, "retrospective": False}   # what each claims


@dataclass(frozen=True)
class LosslessConfig:
    """The next token after the prompt under the target's settings (temperature, top-k) and a draft
    distribution (the same model under its own temperature and top-k), checked rule by rule."""
    temperature: float = 1.0
    top_k: int = 8
    draft_temperature: float = 2.0
    draft_top_k: int = 8
    candidates: int = 2              # DSpark's candidates at the first position (the draft's top ones)
    lossy_threshold: float = 0.1     # the lossy mode accepts a candidate outright above this p_target
    samples: int = 2000              # seeded rounds per rule for the empirical histogram
    seed: int = 0

    def __post_init__(self):
        for name in ("temperature", "draft_temperature"):
            value = getattr(self, name)
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and 0.05 <= value <= 10, name, value,
                  "must be a number in [0.05, 10] (sampling; temperature 0 has nothing to check)")
        check_count("top_k", self.top_k, 50)
        check_count("draft_top_k", self.draft_top_k, 50)
        check_count("candidates", self.candidates, 8)
        check(isinstance(self.lossy_threshold, (int, float)) and not isinstance(self.lossy_threshold, bool)
              and 0 < self.lossy_threshold < 1, "lossy_threshold", self.lossy_threshold, "must be a number in (0, 1)")
        check_count("samples", self.samples, 100_000)
        check(isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0, "seed", self.seed,
              "must be an integer >= 0")


@dataclass(frozen=True)
class RuleOutcome:
    rule: str
    exact: tuple[float, ...]         # the next token's distribution over the support, computed exactly
    counts: tuple[int, ...]          # how often each support token came out of `samples` seeded rounds
    tv_distance: float               # ½ Σ |exact − p_target|
    chi2: float
    dof: int
    p_value: float                   # of the counts against p_target


@dataclass(frozen=True)
class LosslessResult:
    token_ids: tuple[int, ...]       # the support: every token either distribution can give
    pieces: tuple[str, ...]
    p_target: tuple[float, ...]
    q_draft: tuple[float, ...]
    candidates: tuple[int, ...]      # support indices of DSpark's first-position candidates
    outcomes: tuple[RuleOutcome, ...]
