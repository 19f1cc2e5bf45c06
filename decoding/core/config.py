"""Frozen, validated configurations, one per strategy. Bad values raise ConfigError naming them."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from decoding.core.draft_names import AUTO, FEATURE_HEAD, LOOKUP, PARALLEL_DRAFTER, RECYCLING, read_draft, read_drafter
from decoding.core.errors import check

MAX_TOP_N = 100
MAX_NUM_BEAMS = 32                     # beam search's widest search
MAX_TOP_K_CANDIDATES = 64              # DSpark's most candidates per lattice position
MAX_SEED = 2**63 - 1               # torch.Generator.manual_seed's range
MIN_TEMPERATURE = 1e-6             # below it, logits / temperature can overflow float32 to inf


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
    """A finite int or float (not a bool, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


@dataclass(frozen=True)
class BaseConfig:
    strategy: ClassVar[str] = "base"
    max_new_tokens: int = 64
    seed: int = 0
    top_n: int = 10                      # candidates recorded per step

    def __post_init__(self):
        check(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens",
              self.max_new_tokens, "must be an integer >= 1")
        check(_is_int(self.seed) and 0 <= self.seed <= MAX_SEED, "seed", self.seed,
              f"must be an integer in [0, {MAX_SEED}]")
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
        check(_is_num(self.temperature) and (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE),
              "temperature", self.temperature, f"must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}")
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
        check(_is_int(self.num_beams) and 1 <= self.num_beams <= MAX_NUM_BEAMS, "num_beams", self.num_beams,
              f"must be an integer in [1, {MAX_NUM_BEAMS}]")
        check(_is_num(self.length_penalty) and abs(self.length_penalty) <= 10, "length_penalty",
              self.length_penalty, "must be a number in [-10, 10]")
        check(isinstance(self.early_stopping, bool), "early_stopping", self.early_stopping,
              "must be true or false")


SPEC_MAX_GAMMA = 32                    # speculative decoding's longest draft (gamma, gamma_max)
MAX_LOOKUP_NGRAM = 16                  # prompt lookup's longest n-gram matched (both strategies)
GAMMA_POLICIES = ("fixed", "heuristic", "confidence", "cost")
COST_POLICY = "cost"                   # γ per round maximizing expected tokens per ms (a verify-cost table)


@dataclass(frozen=True)
class SpeculativeConfig(SamplingParams):
    """Speculative decoding: a drafter proposes up to `gamma` tokens, one target forward verifies them.

    `draft` names the drafter (decoding.core.draft_names, one grammar with DSpark's `drafter`): "auto" (the
    default: "lookup+feature" where the shipped feature drafter was trained for the model, "lookup+recycling"
    on any other), "lookup" (prompt lookup), "recycling" / "suffix" (no files), a draft model ("model:ID", or
    the id or path alone), "feature[:FILE]", "shallow[:FILE]", or "lookup+" one of those: prompt lookup where
    the context has an n-gram match of 2+ tokens (1 with lookup_max_ngram 1), the other drafter in the other
    rounds. A run loads what the name needs unless given it as `drafter=` (`draft_model` names what to load).
    Temperature 0 verifies by argmax.
    """

    strategy: ClassVar[str] = "speculative"
    draft: str = AUTO
    gamma: int = 5
    gamma_policy: str = "fixed"          # fixed | heuristic | confidence | cost
    confidence_threshold: float = 0.4    # confidence policy: stop drafting below this q_draft
    gamma_max: int = 0                   # >gamma: draft (and record) up to gamma_max, verify gamma
    lookup_max_ngram: int = 2            # prompt lookup: longest n-gram matched
    cost_table: str | None = None        # cost policy: JSON file of verify ms per token count, or "auto" (None: auto)
    temperature: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check(self.cost_table is None or (isinstance(self.cost_table, str) and self.cost_table.strip() != ""),
              "cost_table", self.cost_table, "must be a JSON file path, 'auto' (profile once) or None")
        check(self.cost_table is None or self.gamma_policy == COST_POLICY, "cost_table", self.cost_table,
              f"is used by gamma_policy '{COST_POLICY}' only (this run's is {self.gamma_policy!r})")
        check(isinstance(self.draft, str) and self.draft.strip() != "", "draft", self.draft,
              "give 'lookup', 'recycling', 'auto' or a draft model id or path")
        read_draft(self.draft)
        check(_is_int(self.gamma) and 1 <= self.gamma <= SPEC_MAX_GAMMA, "gamma", self.gamma,
              f"must be an integer in [1, {SPEC_MAX_GAMMA}]")
        check(self.gamma_policy in GAMMA_POLICIES, "gamma_policy", self.gamma_policy,
              f"choose one of {', '.join(GAMMA_POLICIES)}")
        check(_is_num(self.confidence_threshold) and 0 <= self.confidence_threshold <= 1,
              "confidence_threshold", self.confidence_threshold, "must be in [0, 1]")
        check(_is_int(self.gamma_max) and (self.gamma_max == 0 or self.gamma <= self.gamma_max <= SPEC_MAX_GAMMA),
              "gamma_max", self.gamma_max, f"must be 0 (off) or an integer in [gamma, {SPEC_MAX_GAMMA}]")
        check(_is_int(self.lookup_max_ngram) and 1 <= self.lookup_max_ngram <= MAX_LOOKUP_NGRAM, "lookup_max_ngram",
              self.lookup_max_ngram, f"must be an integer in [1, {MAX_LOOKUP_NGRAM}]")

    @property
    def is_lookup(self) -> bool:
        return self.draft == LOOKUP

    def cost_need(self) -> int:
        """Tokens a cost table must cover: the longest verification (γ drafts + the pending token)."""
        return self.gamma + 1

    @property
    def draft_model(self) -> str | None:
        """The drafter a run must load, as the name writes it (decoding.drafters.factory.load_draft): None for
        prompt lookup and the training-free sources; "auto" loads the shipped feature drafter where it fits."""
        spec = read_draft(self.draft)
        return AUTO if spec.auto else spec.trained.text if spec.trained else None


DSPARK_SELECT = ("chain", "tree")
DSPARK_MAX_GAMMA = 16                  # DSpark's most positions per drafter pass (also bounds a Lattice)
DSPARK_MAX_BUDGET = 256                # most tree nodes verified in one round (also bounds best_tree)
AUTO_COST = "auto"                     # profile the verify cost on this device once, then cache it
FIXED_SIZE = "none"                    # DSpark without a cost table: the chain length / tree budget as set


@dataclass(frozen=True)
class DSparkConfig(SamplingParams):
    """Parallel drafting: one drafter pass proposes γ positions × K candidates (a lattice); a DP on the draft
    side picks a chain or a tree (cost-aware when a cost table is given); one target forward verifies it
    with the exact rules. `cost_table` ("auto" by default: the verify cost profiled once on this device,
    the round's overhead timed once per drafter) sizes each round's chain or tree by expected tokens per
    millisecond, up to gamma / budget; None or "none" verifies the size as set. A seeded run with "auto"
    depends on the machine's timings; a table file makes it reproducible. `drafter` (decoding.core.draft_names,
    one grammar with speculative decoding's `draft`): "auto" (the default: the shipped feature drafter as a
    sequential head where the model is the one it was trained for, token recycling on any other), "feature"
    (that head alone), "parallel" (the shipped parallel drafter; "default" is an older name for it),
    "feature:FILE" / "parallel:FILE" (or a bare FILE: a parallel drafter) for trained weights, "recycling",
    "suffix" (no files) or "model:ID" (a draft model), joined with "+" after a trained one to compose them
    ("feature+recycling"); a run may also pass a loaded drafter as `drafter=`. lossy_threshold (LOSSY, off by
    default) accepts a candidate outright when p_target(x) exceeds it. lookup_max_ngram >
    0 adds prompt lookup's continuation (longest n-gram matched) to the lattice as one more candidate
    per position, scored by its acceptance rate so far in the run (0: off)."""

    strategy: ClassVar[str] = "dspark"
    gamma: int = 8
    top_k_candidates: int = 3
    select: str = "tree"                  # chain | tree
    budget: int = 8                       # tree nodes verified (tree mode)
    cost_table: str | None = AUTO_COST    # verify ms per token count: "auto", a JSON file; None / "none": fixed size
    lossy_threshold: float | None = None
    drafter: str = AUTO
    lookup_max_ngram: int = 2             # prompt-lookup candidates in the lattice (0: off)
    temperature: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check(_is_int(self.gamma) and 1 <= self.gamma <= DSPARK_MAX_GAMMA, "gamma", self.gamma,
              f"must be an integer in [1, {DSPARK_MAX_GAMMA}]")
        check(_is_int(self.top_k_candidates) and 1 <= self.top_k_candidates <= MAX_TOP_K_CANDIDATES,
              "top_k_candidates", self.top_k_candidates, f"must be an integer in [1, {MAX_TOP_K_CANDIDATES}]")
        check(self.select in DSPARK_SELECT, "select", self.select, f"choose one of {', '.join(DSPARK_SELECT)}")
        check(_is_int(self.budget) and 1 <= self.budget <= DSPARK_MAX_BUDGET, "budget", self.budget,
              f"must be an integer in [1, {DSPARK_MAX_BUDGET}]")
        check(self.cost_table is None or (isinstance(self.cost_table, str) and self.cost_table.strip() != ""),
              "cost_table", self.cost_table, "must be a JSON file path, 'auto' (profile once) or 'none' (fixed size)")
        if self.cost_table == FIXED_SIZE:
            object.__setattr__(self, "cost_table", None)
        check(self.lossy_threshold is None or (_is_num(self.lossy_threshold) and 0 < self.lossy_threshold <= 1),
              "lossy_threshold", self.lossy_threshold, "must be a number in (0, 1] (or None: exact)")
        check(self.lossy_threshold is None or self.temperature > 0, "lossy_threshold", self.lossy_threshold,
              "applies to temperature > 0 only (temperature 0 accepts by argmax)")
        check(isinstance(self.drafter, str) and self.drafter.strip() != "", "drafter", self.drafter,
              f"give '{AUTO}', '{FEATURE_HEAD}' (the feature drafter as a sequential head), "
              f"'{PARALLEL_DRAFTER}' (the parallel drafter), '{RECYCLING}' (token recycling, any model) or a "
              "parallel drafter's weights file, with '+recycling' to add token recycling")
        read_drafter(self.drafter)
        check(_is_int(self.lookup_max_ngram) and 0 <= self.lookup_max_ngram <= MAX_LOOKUP_NGRAM, "lookup_max_ngram",
              self.lookup_max_ngram, f"must be an integer in [0, {MAX_LOOKUP_NGRAM}] (0: no prompt-lookup candidates)")

    def cost_need(self) -> int:
        """Tokens a cost table must cover for this config: the largest chain or tree verified, plus one."""
        return (self.gamma if self.select == "chain" else self.budget) + 1

    @property
    def is_lossy(self) -> bool:
        return self.lossy_threshold is not None


# every strategy's config class by its name, in the runner's order (decoding/runner.py registers the same)
CONFIGS: dict[str, type[BaseConfig]] = {cls.strategy: cls for cls in (GreedyConfig, SampleConfig, BeamConfig,
                                                                      SpeculativeConfig, DSparkConfig)}
