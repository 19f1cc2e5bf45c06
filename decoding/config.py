"""Frozen, validated configurations, one per strategy. Bad values raise ConfigError naming them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from decoding.errors import check

MAX_TOP_N = 100


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


@dataclass(frozen=True)
class BaseConfig:
    strategy: ClassVar[str] = "base"
    max_new_tokens: int = 64
    seed: int = 0
    top_n: int = 10                      # candidates recorded per step

    def __post_init__(self):
        check(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens",
              self.max_new_tokens, "must be an integer >= 1")
        check(_is_int(self.seed) and self.seed >= 0, "seed", self.seed, "must be an integer >= 0")
        check(_is_int(self.top_n) and 1 <= self.top_n <= MAX_TOP_N, "top_n", self.top_n,
              f"must be an integer in [1, {MAX_TOP_N}]")

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class SamplingParams(BaseConfig):
    """Shared sampling knobs (transformers' order: temperature, top-k, top-p, min-p)."""

    temperature: float = 1.0
    top_k: int = 0                       # 0 disables
    top_p: float = 1.0                   # 1 disables
    min_p: float = 0.0                   # 0 disables

    def __post_init__(self):
        super().__post_init__()
        check(_is_num(self.temperature) and self.temperature >= 0, "temperature", self.temperature,
              "must be a number >= 0")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k, "must be an integer >= 0")
        check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", self.min_p, "must be in [0, 1]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GreedyConfig(BaseConfig):
    strategy: ClassVar[str] = "greedy"


@dataclass(frozen=True)
class SampleConfig(SamplingParams):
    strategy: ClassVar[str] = "sample"

    def __post_init__(self):
        super().__post_init__()
        check(self.temperature > 0, "temperature", self.temperature,
              "must be > 0 for sampling (temperature 0 is the greedy strategy)")


@dataclass(frozen=True)
class BeamConfig(BaseConfig):
    strategy: ClassVar[str] = "beam"
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool = False

    def __post_init__(self):
        super().__post_init__()
        check(_is_int(self.num_beams) and 1 <= self.num_beams <= 32, "num_beams", self.num_beams,
              "must be an integer in [1, 32]")
        check(_is_num(self.length_penalty) and abs(self.length_penalty) <= 10, "length_penalty",
              self.length_penalty, "must be a number in [-10, 10]")
        check(isinstance(self.early_stopping, bool), "early_stopping", self.early_stopping,
              "must be true or false")


MAX_GAMMA = 32
GAMMA_POLICIES = ("fixed", "heuristic", "confidence")


@dataclass(frozen=True)
class SpeculativeConfig(SamplingParams):
    """Speculative decoding: a drafter proposes up to `gamma` tokens, one target forward verifies them.

    `draft` names the drafter: "lookup" (prompt lookup) or a draft model (an id or a path that the
    caller loads and passes to the run as `drafter=`/`draft_lm=`). Temperature 0 verifies by argmax.
    """

    strategy: ClassVar[str] = "speculative"
    draft: str = "lookup"
    gamma: int = 5
    gamma_policy: str = "fixed"          # fixed | heuristic | confidence
    confidence_threshold: float = 0.4    # confidence policy: stop drafting below this q_draft
    gamma_max: int = 0                   # >gamma: draft (and record) up to gamma_max, verify gamma
    lookup_max_ngram: int = 2            # prompt lookup: longest n-gram matched
    temperature: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check(isinstance(self.draft, str) and self.draft.strip() != "", "draft", self.draft,
              "give 'lookup' or a draft model id or path")
        check(_is_int(self.gamma) and 1 <= self.gamma <= MAX_GAMMA, "gamma", self.gamma,
              f"must be an integer in [1, {MAX_GAMMA}]")
        check(self.gamma_policy in GAMMA_POLICIES, "gamma_policy", self.gamma_policy,
              f"choose one of {', '.join(GAMMA_POLICIES)}")
        check(_is_num(self.confidence_threshold) and 0 <= self.confidence_threshold <= 1,
              "confidence_threshold", self.confidence_threshold, "must be in [0, 1]")
        check(_is_int(self.gamma_max) and (self.gamma_max == 0 or self.gamma <= self.gamma_max <= MAX_GAMMA),
              "gamma_max", self.gamma_max, f"must be 0 (off) or an integer in [gamma, {MAX_GAMMA}]")
        check(_is_int(self.lookup_max_ngram) and 1 <= self.lookup_max_ngram <= 16, "lookup_max_ngram",
              self.lookup_max_ngram, "must be an integer in [1, 16]")

    @property
    def is_lookup(self) -> bool:
        return self.draft == "lookup"
