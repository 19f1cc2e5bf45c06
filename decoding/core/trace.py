"""Trace contract: frozen dataclasses for step events and the Trace, with a versioned JSON round trip.

A trace holds plain Python values only (no tensors), so it can be cached, saved, replayed and diffed.
JSON: `schema_version` is "major.minor"; a reader accepts its own major version and any minor version
(fields added in a later minor are optional, with defaults). Non-finite floats are written as null;
a null in a logit, log-probability or score field reads back as -inf (the only non-finite value a
trace stores). Loading checks every field (the free-form config and model by the same rules), every
closed set's value (CLOSED_SETS), every cross-reference between fields, the output and statistics
against the steps (trace_check, trace_totals) and every size limit (MAX_* here and in trace_check), so
that whatever loads can be drawn and written again.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from decoding.core.config import DSPARK_SELECT, GAMMA_POLICIES
from decoding.core.trace_check import MAX_BEAM_POOL as MAX_BEAM_POOL
from decoding.core.trace_check import MAX_BEAMS as MAX_BEAMS
from decoding.core.trace_check import MAX_LATTICE_CANDIDATES as MAX_LATTICE_CANDIDATES
from decoding.core.trace_check import TraceFormatError as TraceFormatError
from decoding.core.trace_check import check_trace, key_part
from decoding.core.trace_totals import METRIC_NAMES, metrics, output_ids, target_forwards

SCHEMA_VERSION = "1.7"   # 1.1: DSpark prompt-lookup fields (DSparkRound.lookup/lookup_scores, cell and node flags)
#                          1.2: SpecRound.gamma_choice (speculative's cost-aware γ)
#                          1.3: kv (KVMemory) on every step event: the target's KV cache after the step;
#                               target_entropy on DraftPosition and PlanNode
#                          1.4: SizeChoiceInfo.overhead_ms (DSpark's round cost outside verification)
#                          1.5: DSpark lattice sources: LatticeCell.sources, PlanNode.sources, DSparkRound.drafting
#                          1.6: SpecRound.drafting (speculative's sources and why, on the first round)
#                          1.7: DraftingInfo.memory (what the training-free sources started from)
MAX_TRACE_BYTES = 50 * 1024 * 1024   # largest trace file read (app uploads and from_json)


@dataclass(frozen=True)
class KVMemory:
    """The target's KV cache around one step: keys and values of every layer, as the tensors hold them.
    Speculative and DSpark rounds also record the cache at its largest, right after the verification
    forward, and what rolling back the rejected drafts (or compacting a tree) freed."""

    bytes: int                     # held after the step
    tokens: int                    # positions held per sequence
    sequences: int = 1             # sequences held (beam search: the live beams)
    peak_bytes: int | None = None  # speculative / DSpark: after the verification forward, before the rollback
    freed_bytes: int = 0           # speculative / DSpark: peak_bytes - bytes


@dataclass(frozen=True)
class Candidate:
    """One token of a distribution's top-N."""

    token_id: int
    piece: str                    # display text; partial UTF-8 shown as <0xE4> bytes
    logit: float                  # -inf where a filter removed it
    prob: float
    removed_by: str | None = None  # name of the filter that removed it; None if kept


@dataclass(frozen=True)
class FilterCut:
    """What one processor did at one step."""

    name: str                  # temperature | top_k | top_p | min_p
    value: float               # its parameter
    threshold: float | None    # top_k: k-th logit; top_p: cumulative mass kept; min_p: probability floor
    removed_mass: float        # mass (under the temperature-scaled distribution) this filter removed
    removed_count: int
    kept_count: int            # tokens still kept after this filter


@dataclass(frozen=True)
class TokenStep:
    """One emitted token of a single-sequence strategy (greedy, sampling)."""

    kind: ClassVar[str] = "token"
    index: int                           # 0-based step number among new tokens
    position: int                        # absolute position of the emitted token in the sequence
    raw_top: tuple[Candidate, ...]       # top-N of the model's distribution
    processed_top: tuple[Candidate, ...]  # top-N after processing (removed ones marked)
    filters: tuple[FilterCut, ...]
    entropy_raw: float                   # nats
    entropy_processed: float
    chosen_id: int
    chosen_piece: str
    chosen_logprob: float                # log of the processed probability
    chosen_raw_logprob: float
    chosen_rank: int                     # rank in the raw distribution (0 = argmax)
    draw: float | None                   # the uniform u of inverse-CDF sampling; None for greedy
    forced: bool = False                 # token imposed by the user (branch / resume)
    timings_ms: dict[str, float] = field(default_factory=dict)
    kv: KVMemory | None = None           # the target's KV cache after the step (None in traces before 1.3)


@dataclass(frozen=True)
class Stats:
    new_tokens: int
    target_forwards: int          # every target forward, prefill included
    wall_s: float
    tokens_per_s: float
    mean_accepted_length: float | None = None
    acceptance_rate: float | None = None
    per_position_acceptance: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Trace:
    schema_version: str
    strategy: str
    config: dict[str, Any]
    model: dict[str, Any]          # name, device, dtype
    prompt_text: str
    prompt_ids: tuple[int, ...]
    forced_ids: tuple[int, ...]    # tokens imposed after the prompt (resume / branch)
    output_ids: tuple[int, ...]    # new tokens only (forced ones included)
    text: str
    steps: tuple[Any, ...]
    stats: Stats
    stop_reason: str               # eos | max_new_tokens | stopped | error
    error: str | None = None


EVENT_TYPES: dict[str, type] = {}


def register_event(cls: type) -> type:
    """Make an event class loadable from JSON by its `kind`."""
    EVENT_TYPES[cls.kind] = cls
    return cls


register_event(TokenStep)


# ---------------------------------------------------------------- beam
# Beam search (decoding/strategies/beam.py). Beam indices refer to the `beams` tuple of the previous step
# (at step 0, to the single prompt row); scores are sums of token log-probabilities of new tokens.

BEAM_STATUSES = ("kept", "pruned", "finished", "finished_dropped", "eos_not_top")


@dataclass(frozen=True)
class BeamCandidate:
    """One entry of a step's candidate pool (the top max(2, 1 + #EOS)·B of the B×V scores), in rank order.
    status: kept (continues as a live beam) | pruned (not among the B best unfinished) | finished (EOS or
    the length limit, ranked in the top B, entered the finished set) | finished_dropped (the same, but
    not better than the B finished hypotheses held) | eos_not_top (EOS ranked below B: discarded)."""

    source_beam: int
    token_id: int
    piece: str
    logprob: float                # log-softmax of the source beam's logits at this token
    score: float                  # cumulative: source beam's score + logprob
    normalized_score: float       # score / (new tokens incl. this one) ** length_penalty
    status: str

    def __post_init__(self):           # the engine's own check; the loader names the field's path first
        if self.status not in BEAM_STATUSES:
            raise TraceFormatError(f"status={self.status!r}: expected one of {', '.join(BEAM_STATUSES)}")


@dataclass(frozen=True)
class LiveBeam:
    """A live beam after a step: its parent in the previous step's beams, its last token, all new tokens."""

    parent: int
    token_id: int
    piece: str
    token_ids: tuple[int, ...]    # new tokens so far (forced prefix excluded)
    score: float


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished hypothesis: ended by EOS, or finalized at the length limit."""

    token_ids: tuple[int, ...]    # new tokens, the final one (EOS or not) included
    score: float                  # summed log-probability
    normalized_score: float       # score / len(token_ids) ** length_penalty
    step: int                     # index of the step that finished it
    eos: bool


@dataclass(frozen=True)
class BeamStep:
    """One beam-search step: one batched target forward over the live beams (the prompt at step 0)."""

    kind: ClassVar[str] = "beam"
    index: int
    position: int                        # absolute position of this step's tokens
    num_beams: int
    pool: tuple[BeamCandidate, ...]      # ranked best first
    beams: tuple[LiveBeam, ...]          # live beams after the step, best first (empty once all finish)
    finished: tuple[BeamHypothesis, ...]  # the best (at most B) finished hypotheses so far, best first
    early_stop: bool                     # no live beam can beat the finished set any more (stays on)
    all_finished: bool                   # early_stopping=True and B hypotheses have finished
    done: bool                           # the search ends after this step
    forced_ids: tuple[int, ...] = ()     # prefix imposed after the prompt (part of the output)
    target_forwards: int = 1
    timings_ms: dict[str, float] = field(default_factory=dict)
    kv: KVMemory | None = None           # the target's KV cache after the step, all beams (None before 1.3)


register_event(BeamStep)


# ---------------------------------------------------------------- speculative decoding

@dataclass(frozen=True)
class ProbEntry:
    """One token of a distribution that has no logits (a residual)."""

    token_id: int
    piece: str
    prob: float


@dataclass(frozen=True)
class DraftPosition:
    """One drafted token of a speculative round and what the verifier made of it."""

    index: int                      # k: 0-based position in the round's draft
    token_id: int
    piece: str
    q_draft: float | None           # draft's probability of its token; None for point-mass drafters
    p_target: float                 # target's (processed) probability of the drafted token
    ratio: float                    # p_target / q_draft (p_target for a point-mass drafter)
    accept_prob: float              # sum_x min(p_target, q_draft): this position's acceptance probability
    u: float | None                 # the uniform draw compared with the ratio; None at temperature 0
    verdict: str                    # accepted | rejected | not_reached | recorded (beyond gamma)
    draft_draw: float | None = None  # the u that sampled the draft token (sampled draft models)
    target_top: tuple[Candidate, ...] = ()  # target's processed top-N at this position
    draft_top: tuple[Candidate, ...] = ()   # drafter's processed top-N (draft models only)
    target_entropy: float | None = None     # nats, of the target's raw distribution here (None before 1.3)


@dataclass(frozen=True)
class LookupMatch:
    """Where prompt lookup matched: the n-gram ending the context, found earlier at match_position."""

    ngram: tuple[int, ...]
    match_position: int             # start of the earlier occurrence of the n-gram in the context
    continuation_start: int         # context index of the first proposed token


@dataclass(frozen=True)
class GammaChoiceInfo:
    """Speculative cost-aware γ: per γ = 1..N, what the round was expected to give and cost."""

    source: str                          # the drafter that drafts this round
    cost_source: str                     # where the verify-cost table came from
    verify_ms: tuple[float, ...]         # the table's ms for 1..N + 1 tokens
    draft_ms: float                      # one draft token (0 for prompt lookup)
    acceptance: tuple[float, ...]        # estimated P(position k accepted | reached), k = 1..N
    expected_tokens: tuple[float, ...]   # 1 + E[accepted drafts] per γ
    ms_per_token: tuple[float, ...]      # (verify(γ + 1) + γ · draft_ms) / expected tokens, per γ
    gamma: int                           # the γ chosen (fewest ms per expected token)


@dataclass(frozen=True)
class DraftingInfo:
    """Which sources a DSpark or speculative run used, and why ("auto" chooses by the model)."""

    sources: tuple[str, ...]
    reason: str
    memory: str = ""     # what recycling/suffix started from: "empty", "N earlier runs" ("": none ran, or before 1.7)


@dataclass(frozen=True)
class SpecRound:
    """One speculative round: draft -> one target forward -> exact acceptance -> rollback.
    The first round's forward also prefills the prompt (the prefill is fused, as in transformers)."""

    kind: ClassVar[str] = "spec_round"
    index: int
    position: int                   # absolute position of the round's first emitted token
    drafter: str                    # lookup | model name
    gamma: int                      # drafts verified this round (after caps and stops)
    gamma_policy: str
    gamma_reason: str
    drafts: tuple[DraftPosition, ...]
    accepted: int                   # accepted drafts
    final_kind: str                 # residual | bonus | none (stopped at EOS or the token budget)
    final_id: int | None
    final_draw: float | None        # u of the residual/bonus sample; None at temperature 0
    final_top: tuple[Candidate, ...]  # target's processed top-N where the final token was chosen
    residual_top: tuple[ProbEntry, ...]
    emitted: tuple[int, ...]        # every token this round added (forced ones first)
    forced_ids: tuple[int, ...] = ()
    fed_tokens: int = 0             # tokens in this round's target forward
    kv_cropped_target: int = 0
    kv_cropped_draft: int = 0
    lookup: LookupMatch | None = None
    target_forwards: int = 1
    timings_ms: dict[str, float] = field(default_factory=dict)
    final_piece: str = ""           # the final token's text (for views; "" in older traces)
    gamma_choice: GammaChoiceInfo | None = None   # gamma_policy "cost": how this round's γ was chosen
    kv: KVMemory | None = None      # the target's cache: at its peak in verification, after the rollback
    drafting: DraftingInfo | None = None   # the first round: the run's sources and why (None before 1.6)


register_event(SpecRound)


# ---------------------------------------------------------------- dspark (parallel drafting)

@dataclass(frozen=True)
class LatticeCell:
    """Candidate j at draft position k (1-based) of a parallel-draft lattice."""

    position: int
    cand: int
    token_id: int
    piece: str
    q_draft: float                 # drafter's marginal probability at this position
    scores: tuple[float, ...]      # ŝ_k(x | parent) for each candidate of position k−1 (one at k = 1)
    lookup: bool = False           # prompt lookup's token at this position (lookup_max_ngram > 0)
    sources: tuple[str, ...] = ()  # the lattice sources that proposed it (before 1.5: see `proposed_by`)


@dataclass(frozen=True)
class LatticeColumn:
    position: int
    confidence: tuple[float, ...]  # calibrated c_k(parent), per candidate of position k−1
    cells: tuple[LatticeCell, ...]


@dataclass(frozen=True)
class ChainDP:
    """Chain mode: V[k][parent][j] and back-pointers back[k][j] (None at the last position)."""

    values: tuple[tuple[tuple[float, ...], ...], ...]
    back: tuple[tuple[int | None, ...], ...]
    path: tuple[int, ...]          # candidate index per position


@dataclass(frozen=True)
class PlanNode:
    """A verified draft node (tree index i >= 1; node 0 is the root, the last emitted token)."""

    node: int
    parent: int
    depth: int
    cand: int
    token_id: int
    piece: str
    score: float                   # ŝ given its parent
    survival: float                # product of ŝ along its path
    p_target: float                # target's processed probability of it at its parent
    p_accept: float | None         # probability it was accepted with (after earlier siblings)
    draw: float | None             # the uniform compared with p_accept; None at temperature 0
    verdict: str                   # accepted | rejected | not_reached
    lookup: bool = False           # on prompt lookup's chain (scored by its acceptance rate)
    target_entropy: float | None = None  # nats, of the target's raw distribution at its parent (None before 1.3)
    sources: tuple[str, ...] = ()  # the lattice sources that proposed its cell (before 1.5: see `proposed_by`)


def proposed_by(item) -> tuple[str, ...]:
    """The sources of a lattice cell or plan node; a trace older than 1.5 records only whether prompt
    lookup proposed it, and the rest came from "the drafter"."""
    if item.sources:
        return item.sources
    return ("lookup",) if item.lookup else ("drafter",)


@dataclass(frozen=True)
class SizeChoiceInfo:
    """Cost-aware size (adaptive γ): the table used and the expected rate per size."""

    cost_source: str
    verify_ms: tuple[float, ...]
    size: int
    expected_accepted: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    overhead_ms: float = 0.0       # ms added to every size's verify cost (the round outside verification)


@dataclass(frozen=True)
class DSparkRound:
    """One parallel-drafting round: drafter pass -> lattice -> DP -> one target forward -> exact
    acceptance -> cache compaction. The prefill event (prefill=True) has no drafts."""

    kind: ClassVar[str] = "dspark_round"
    index: int
    position: int                  # absolute position of the round's first emitted token
    prefill: bool
    select: str                    # chain | tree
    lattice: tuple[LatticeColumn, ...]
    dp: ChainDP | None
    nodes: tuple[PlanNode, ...]    # the chosen chain/tree, parents before children
    expected_accepted: float
    size: SizeChoiceInfo | None
    accepted_path: tuple[int, ...]  # accepted node indices (root excluded)
    next_token: int
    next_from: str                 # residual | bonus | argmax | prefill
    next_draw: float | None
    emitted: tuple[int, ...]       # tokens this round added (forced ones first), after truncation
    lossy: bool = False
    forced_ids: tuple[int, ...] = ()
    fed_tokens: int = 0            # tokens in this round's target forward
    target_forwards: int = 1
    timings_ms: dict[str, float] = field(default_factory=dict)
    next_piece: str = ""           # the next token's text (for views; "" in older traces)
    lookup: LookupMatch | None = None              # where prompt lookup matched (lookup_max_ngram > 0)
    lookup_scores: tuple[float, float] | None = None  # (λ_first, λ_continuation) used this round
    kv: KVMemory | None = None     # the target's cache: at its peak in verification, after compaction
    drafting: DraftingInfo | None = None           # the prefill event: the run's sources (None before 1.5)


register_event(DSparkRound)


# ---------------------------------------------------------------- closed sets
# The values a field may hold, checked at load in every schema version (a newer minor version may add
# fields, never values: the views know these). Open fields (a drafter's or a cost table's name, lattice
# sources) are only capped.
STOP_REASONS = ("eos", "max_new_tokens", "stopped", "error")
FILTER_NAMES = ("temperature", "top_k", "top_p", "min_p")      # decoding.core.processors' names
DRAFT_VERDICTS = ("accepted", "rejected", "not_reached", "recorded")
NODE_VERDICTS = ("accepted", "rejected", "not_reached")
FINAL_KINDS = ("residual", "bonus", "none")
NEXT_FROM = ("residual", "bonus", "argmax", "prefill")
CLOSED_SETS: dict[tuple[type, str], tuple[str, ...]] = {
    (Trace, "stop_reason"): STOP_REASONS,
    (Candidate, "removed_by"): FILTER_NAMES,
    (FilterCut, "name"): FILTER_NAMES,
    (BeamCandidate, "status"): BEAM_STATUSES,
    (DraftPosition, "verdict"): DRAFT_VERDICTS,
    (SpecRound, "final_kind"): FINAL_KINDS,
    (SpecRound, "gamma_policy"): GAMMA_POLICIES,
    (PlanNode, "verdict"): NODE_VERDICTS,
    (DSparkRound, "select"): DSPARK_SELECT,
    (DSparkRound, "next_from"): NEXT_FROM,
}


def recounted(trace: Trace) -> Trace:
    """The trace with `output_ids`, the stats' counts and the speculative metrics recomputed from its
    steps (decoding.core.trace_totals), for tools that build a trace from other traces' steps
    (bench/trace_load.py); the loader refuses a trace whose recorded values differ from these."""
    out = tuple(output_ids(trace.steps))
    found = metrics(trace.steps)
    stats = dataclasses.replace(trace.stats, new_tokens=len(out), target_forwards=target_forwards(trace.steps),
                                **{name: found.get(name) for name in METRIC_NAMES})
    return dataclasses.replace(trace, output_ids=out, stats=stats)


# ---------------------------------------------------------------- writing

def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        out = {"kind": value.kind} if hasattr(type(value), "kind") else {}
        out.update({f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)})
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_dict(trace: Trace) -> dict[str, Any]:
    return _plain(trace)


def to_json(trace: Trace, indent: int | None = None) -> str:
    return json.dumps(to_dict(trace), indent=indent, ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------- reading
# A trace is built by one converter per type, made once per (type, role) from each dataclass's field
# plan (typing.get_type_hints runs once per class). A refused value raises _Bad deep inside; each
# enclosing list, object and field adds its part of the path on the way out, so a valid trace pays for
# no path strings. Cross-references between fields are checked afterwards (decoding.core.trace_check).

# Per-kind limits live with the checks and are imported above: MAX_BEAMS (num_beams), MAX_BEAM_POOL (a beam
# step's pool), MAX_LATTICE_CANDIDATES (a DSpark lattice position), with the config's MAX_TOP_N,
# SPEC_MAX_GAMMA, DSPARK_MAX_GAMMA and DSPARK_MAX_BUDGET.
MAX_STEPS = 1 << 20           # steps per trace: each emits at least one token, so a long model context's worth
MAX_TOKENS = 1 << 20          # ids in one token list (prompt, output, emitted, a beam's hypothesis)
MAX_LIST_ITEMS = 4096         # items in any other list or object (top-N, pools, lattices, cost tables)
MAX_TEXT_CHARS = 1 << 24      # characters in prompt_text, text, error and the free-form config and model
MAX_LABEL_CHARS = 4096        # characters in any other string: pieces, names, reasons, paths, object keys
MAX_FLOAT = 1e300             # largest magnitude of a float, so that sums and differences of a few stay finite
TEXT_FIELDS = frozenset({"prompt_text", "text", "error"})
LOGIT_FIELDS = frozenset({"logit", "logprob", "score", "normalized_score", "chosen_logprob", "chosen_raw_logprob"})
ID_FIELDS = frozenset({"token_id", "chosen_id", "final_id", "next_token"})              # one token id
ID_LIST_FIELDS = frozenset({"prompt_ids", "forced_ids", "output_ids", "emitted", "token_ids", "ngram"})
INT_RANGE = (-2**63, 2**63)   # integer fields are int64 (the views' tables hold them as such)


class _Bad(Exception):
    """A refused value: `detail` follows the path, which `parts` collects innermost first."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail, self.parts = detail, []

    def within(self, part: str) -> _Bad:
        self.parts.append(part)
        return self

    def line(self) -> str:
        return "trace" + "".join(reversed(self.parts)) + self.detail


@dataclass(frozen=True)
class _Reading:
    strict: bool               # refuse unknown fields (a trace of this or an older minor version)
    vocab: int | None          # token ids must be below it (None: only >= 0)


def _shown(value: Any) -> str:
    return f"{value!r:.60}"


def _check_string(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise _Bad(f": expected str, got {_shown(value)}")
    if len(value) > limit:
        raise _Bad(f": a string of {len(value)} characters is over the {limit} character limit")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise _Bad(f"={_shown(value)} is not valid Unicode: a lone surrogate "
                       f"{value[err.start]!r} at character {err.start}") from None
    return value


def _to_str(role: str | None):
    limit = MAX_TEXT_CHARS if role == "text" else MAX_LABEL_CHARS

    def convert(value: Any, reading: _Reading) -> str:
        if type(value) is str and value.isascii() and len(value) <= limit:
            return value
        return _check_string(value, limit)
    return convert


def _to_int(value: Any, reading: _Reading) -> int:
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise _Bad(f": expected int, got {_shown(value)}")
    if not INT_RANGE[0] <= value < INT_RANGE[1]:
        raise _Bad(f"={_shown(value)} is out of range (a 64-bit integer)")
    return value


def _to_token(value: Any, reading: _Reading) -> int:
    _to_int(value, reading)
    if value < 0 or (reading.vocab is not None and value >= reading.vocab):
        raise _Bad(f"={value} is out of range" + (f" (the model has {reading.vocab} tokens)" if reading.vocab
                                                  else " (negative)"))
    return value


def _to_float(value: Any, reading: _Reading) -> float:
    if type(value) is float and -MAX_FLOAT <= value <= MAX_FLOAT:
        return value
    return _number(value, negative_infinity=False)


def _to_logit(value: Any, reading: _Reading) -> float:
    """A float that may also be -inf (null): a logit, a log-probability or a beam score."""
    if type(value) is float and -MAX_FLOAT <= value <= MAX_FLOAT:
        return value
    return _number(value, negative_infinity=True)


def _number(value: Any, negative_infinity: bool) -> float:
    if value is None or (type(value) is float and value == -math.inf):
        if negative_infinity:
            return -math.inf
        raise _Bad(f"={value!r} is not a number: only logits, log-probabilities and scores may be -inf (null)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f": expected a number, got {_shown(value)}")
    if not -MAX_FLOAT <= value <= MAX_FLOAT:
        raise _Bad(f"={_shown(value)} is not a finite number of magnitude <= {MAX_FLOAT:g}")
    return float(value)


def _to_bool(value: Any, reading: _Reading) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f": expected bool, got {_shown(value)}")
    return value


def _free(value: Any, reading: _Reading) -> Any:
    """A free-form value (config, model): any JSON under the rules of the typed fields: strings and keys
    checked as text, integers 64-bit, numbers finite (null is a value here, not -inf), lists and
    objects within MAX_LIST_ITEMS."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _check_string(value, MAX_TEXT_CHARS)
    if isinstance(value, int):
        return _to_int(value, reading)
    if isinstance(value, float):
        return _number(value, negative_infinity=False)
    if not isinstance(value, (dict, list)):
        raise _Bad(f": expected a JSON value, got {type(value).__name__}")
    if len(value) > MAX_LIST_ITEMS:
        what = ("an object", "fields", "field") if isinstance(value, dict) else ("a list", "items", "item")
        raise _Bad(f": {what[0]} of {len(value)} {what[1]} is over the {MAX_LIST_ITEMS} {what[2]} limit")
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                _check_string(key, MAX_LABEL_CHARS)
                _free(item, reading)
            except _Bad as bad:
                raise bad.within(key_part(key)) from None
    elif isinstance(value, list):
        for i, item in enumerate(value):
            try:
                _free(item, reading)
            except _Bad as bad:
                raise bad.within(f"[{i}]") from None
    return value


def _optional(inner):
    return lambda value, reading: None if value is None else inner(value, reading)


def _all_fast(inner):
    """A whole-list test that passes exactly the lists `inner` takes item by item unchanged."""
    if inner is _to_float:
        return lambda items, reading: all(type(v) is float and -MAX_FLOAT <= v <= MAX_FLOAT for v in items)
    if inner is _to_int:
        return lambda items, reading: all(type(v) is int for v in items) and (
            not items or (INT_RANGE[0] <= min(items) and max(items) < INT_RANGE[1]))
    if inner is _to_token:
        return lambda items, reading: all(type(v) is int for v in items) and (
            not items or (min(items) >= 0 and (reading.vocab is None or max(items) < reading.vocab)))
    return None


def _to_tuple(inner, limit: int):
    fast = _all_fast(inner)

    def convert(value: Any, reading: _Reading) -> tuple:
        if not isinstance(value, list):
            raise _Bad(f": expected a list, got {type(value).__name__}")
        if len(value) > limit:
            raise _Bad(f": a list of {len(value)} items is over the {limit} item limit")
        if fast is not None and fast(value, reading):
            return tuple(value)
        try:
            return tuple([inner(v, reading) for v in value])
        except _Bad:
            pass
        for i, v in enumerate(value):   # again, one at a time, to name the item
            try:
                inner(v, reading)
            except _Bad as bad:
                raise bad.within(f"[{i}]") from None
        raise AssertionError("unreachable")
    return convert


def _to_pair(inners):
    def convert(value: Any, reading: _Reading) -> tuple:
        if not isinstance(value, list) or len(value) != len(inners):
            raise _Bad(f": expected a list of {len(inners)} items, got {_shown(value)}")
        out = []
        for i, (inner, v) in enumerate(zip(inners, value)):
            try:
                out.append(inner(v, reading))
            except _Bad as bad:
                raise bad.within(f"[{i}]") from None
        return tuple(out)
    return convert


def _to_dict(inner):
    def convert(value: Any, reading: _Reading) -> dict:
        if not isinstance(value, dict):
            raise _Bad(f": expected an object, got {type(value).__name__}")
        if len(value) > MAX_LIST_ITEMS:
            raise _Bad(f": an object of {len(value)} fields is over the {MAX_LIST_ITEMS} field limit")
        out = {}
        for key, item in value.items():
            try:
                out[_check_string(key, MAX_LABEL_CHARS)] = inner(item, reading)
            except _Bad as bad:
                raise bad.within(key_part(key)) from None
        return out
    return convert


@dataclass(frozen=True)
class _Plan:
    """How to build one dataclass: (name, converter, required) per field, and the names it knows."""

    fields: tuple[tuple[str, Any, bool], ...]
    names: frozenset[str]


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = tuple((f.name, _closed(CLOSED_SETS.get((cls, f.name)), _converter(hints[f.name], _role(f.name))),
                    f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                   for f in dataclasses.fields(cls))
    return _Plan(fields, frozenset(name for name, _c, _r in fields) | {"kind"})


def _closed(values: tuple[str, ...] | None, inner):
    """`inner`, then (for a field of CLOSED_SETS) the value must be one of `values` (or null where allowed)."""
    if values is None:
        return inner

    def convert(value: Any, reading: _Reading) -> Any:
        out = inner(value, reading)
        if out is not None and out not in values:
            raise _Bad(f"={_shown(out)} is not one of {', '.join(values)}")
        return out
    return convert


def _role(name: str) -> str | None:
    """How a field's leaf values are read: token ids, floats that may be -inf, long text, or plain."""
    if name in ID_FIELDS or name in ID_LIST_FIELDS:
        return "id"
    if name in LOGIT_FIELDS:
        return "logit"
    return "text" if name in TEXT_FIELDS else None


@functools.cache
def _converter(tp: Any, role: str | None = None):
    """(value, reading) -> the built value of type `tp`, or _Bad."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _free
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _optional(_converter(inner[0], role))
    if tp is int:
        return _to_token if role == "id" else _to_int
    if tp is str:
        return _to_str(role)
    if tp is float:
        return _to_logit if role == "logit" else _to_float
    if tp is bool:
        return _to_bool
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _to_tuple(_converter(args[0], role), MAX_TOKENS if role == "id" else MAX_LIST_ITEMS)
    if origin is tuple:
        return _to_pair(tuple(_converter(a, role) for a in args))
    if origin is dict:
        return _to_dict(_converter(args[1], role))
    if dataclasses.is_dataclass(tp):
        return _to_dataclass(tp)
    raise TypeError(f"a trace field cannot have type {tp}")


_ABSENT = object()


def _to_dataclass(cls: type):
    def convert(value: Any, reading: _Reading) -> Any:
        if not isinstance(value, dict):
            raise _Bad(f": expected an object, got {type(value).__name__}")
        plan = _plan(cls)
        if reading.strict and not plan.names.issuperset(value):
            extra = sorted(str(k) for k in value if k not in plan.names)
            raise _Bad(f": unknown field(s) {extra[:8]}")
        kwargs = {}
        for name, convert_field, required in plan.fields:
            item = value.get(name, _ABSENT)
            if item is not _ABSENT:
                try:
                    kwargs[name] = convert_field(item, reading)
                except _Bad as bad:
                    raise bad.within(f".{name}") from None
            elif required:
                raise _Bad(f": missing field '{name}'")
        try:
            return cls(**kwargs)
        except TraceFormatError as err:    # a class's own check (e.g. a beam candidate's status)
            raise _Bad(f".{err}") from None
    return convert


def _to_event(value: Any, reading: _Reading) -> Any:
    kind = value.get("kind") if isinstance(value, dict) else value
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise _Bad(f": unknown step kind {_shown(kind)}")
    return _converter(cls)(value, reading)


VERSION_FORM = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")   # ASCII digits, no sign, no leading 0


def _major_minor(version: Any) -> tuple[int, int]:
    """A string "MAJOR.MINOR" of ASCII digits and nothing else (no space, sign, underscore, line end)."""
    found = VERSION_FORM.fullmatch(version) if isinstance(version, str) else None
    if found is None:
        raise TraceFormatError(f"schema_version={_shown(version)} is not 'major.minor' (ASCII digits, e.g. "
                               f"{SCHEMA_VERSION!r})")
    return int(found[1]), int(found[2])


def _vocab(data: dict, vocab_size: int | None) -> int | None:
    """The vocabulary given, else the one the trace's own model records."""
    if vocab_size is not None:
        return vocab_size
    model = data.get("model")
    recorded = model.get("vocab_size") if isinstance(model, dict) else None
    return recorded if type(recorded) is int and recorded > 0 else None


def from_dict(data: Any, vocab_size: int | None = None) -> Trace:
    """Validate and rebuild a Trace; raise TraceFormatError naming the first problem: a field's type, a
    token id outside the vocabulary, a string that is not valid Unicode, a size over its limit (MAX_*),
    or a cross-reference between fields (decoding.core.trace_check)."""
    if not isinstance(data, dict):
        raise TraceFormatError("a trace must be a JSON object")
    major, minor = _major_minor(data.get("schema_version"))
    our_major, our_minor = _major_minor(SCHEMA_VERSION)
    if major != our_major:
        raise TraceFormatError(f"schema_version={_shown(data.get('schema_version'))} is not supported "
                               f"(this version reads {our_major}.x)")
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise TraceFormatError("trace.steps: expected a list")
    if len(steps) > MAX_STEPS:
        raise TraceFormatError(f"trace.steps: {len(steps)} steps is over the {MAX_STEPS} step limit")
    reading = _Reading(strict=minor <= our_minor, vocab=_vocab(data, vocab_size))
    try:
        trace = _converter(Trace)({**data, "steps": []}, reading)
        built = []
        for i, step in enumerate(steps):
            try:
                built.append(_to_event(step, reading))
            except _Bad as bad:
                raise bad.within(f".steps[{i}]") from None
    except _Bad as bad:
        raise TraceFormatError(bad.line()) from None
    except RecursionError:
        raise TraceFormatError("not a trace: JSON nested too deeply") from None
    trace = dataclasses.replace(trace, steps=tuple(built))
    check_trace(trace)
    return trace


def from_json(text: str | bytes, vocab_size: int | None = None) -> Trace:
    """Load a trace; raise TraceFormatError for a file over MAX_TRACE_BYTES, not JSON, or not a trace."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceFormatError(f"trace size={len(text)} bytes is over the {MAX_TRACE_BYTES} byte limit "
                               f"({MAX_TRACE_BYTES / 2**20:g} MiB)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise TraceFormatError("not a trace: JSON nested too deeply") from None
    except ValueError as err:    # malformed JSON, bytes that are not UTF-8, an integer of too many digits
        raise TraceFormatError(f"not valid JSON: {err}") from None
    return from_dict(data, vocab_size)


def without_timings(value: Any) -> Any:
    """Plain-dict form with every timing field dropped, for comparing traces of seeded runs."""
    data = _plain(value)
    return _strip(data)


_TIMING_KEYS = {"timings_ms", "wall_s", "tokens_per_s"}


def _strip(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _strip(v) for k, v in data.items() if k not in _TIMING_KEYS}
    if isinstance(data, list):
        return [_strip(v) for v in data]
    return data
