"""Trace contract: frozen dataclasses for step events and the Trace, with a versioned JSON round trip.

A trace holds plain Python values only (no tensors), so it can be cached, saved, replayed and diffed.
JSON: `schema_version` is "major.minor"; a reader accepts its own major version and any minor version
(fields added in a later minor are optional, with defaults). Non-finite floats are written as null;
a null in a field typed `float` reads back as -inf (the only non-finite value a trace stores).
"""
from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = "1.2"   # 1.1: DSpark prompt-lookup fields (DSparkRound.lookup/lookup_scores, cell and node flags)
#                          1.2: SpecRound.gamma_choice (speculative's cost-aware γ)
MAX_TRACE_BYTES = 50 * 1024 * 1024   # largest trace file read (app uploads and from_json)


class TraceFormatError(ValueError):
    """A trace file that cannot be loaded; the message says what is wrong and where."""


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

    def __post_init__(self):
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

    def emitted_ids(self) -> list[int]:
        return list(self.emitted)


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


@dataclass(frozen=True)
class SizeChoiceInfo:
    """Cost-aware size (adaptive γ): the table used and the expected rate per size."""

    cost_source: str
    verify_ms: tuple[float, ...]
    size: int
    expected_accepted: tuple[float, ...]
    tokens_per_s: tuple[float, ...]


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

    def emitted_ids(self) -> list[int]:
        return list(self.emitted)


register_event(DSparkRound)


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

def _major_minor(version: Any) -> tuple[int, int]:
    try:
        major, minor = str(version).split(".")
        return int(major), int(minor)
    except ValueError:
        raise TraceFormatError(f"schema_version={version!r} is not 'major.minor'") from None


def _build(tp: Any, value: Any, where: str, strict: bool) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value, where, strict)
    if tp is float:
        if value is None:
            return -math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceFormatError(f"{where}: expected a number, got {value!r:.60}")
        return float(value)
    if tp in (int, str, bool):
        ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
        if not ok:
            raise TraceFormatError(f"{where}: expected {tp.__name__}, got {value!r:.60}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise TraceFormatError(f"{where}: expected a list, got {type(value).__name__}")
        (inner, _ellipsis) = typing.get_args(tp)
        return tuple(_build(inner, v, f"{where}[{i}]", strict) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise TraceFormatError(f"{where}: expected an object, got {type(value).__name__}")
        _k, inner = typing.get_args(tp)
        return {k: _build(inner, v, f"{where}.{k}", strict) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, where, strict)
    raise TraceFormatError(f"{where}: unsupported type {tp}")


def _build_dataclass(cls: type, value: Any, where: str, strict: bool) -> Any:
    if not isinstance(value, dict):
        raise TraceFormatError(f"{where}: expected an object, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(value) - names - {"kind"}
    if extra and strict:
        raise TraceFormatError(f"{where}: unknown field(s) {sorted(extra)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _build(hints[f.name], value[f.name], f"{where}.{f.name}", strict)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TraceFormatError(f"{where}: missing field '{f.name}'")
    return cls(**kwargs)


def _build_event(value: Any, where: str, strict: bool) -> Any:
    if not isinstance(value, dict) or value.get("kind") not in EVENT_TYPES:
        kind = value.get("kind") if isinstance(value, dict) else value
        raise TraceFormatError(f"{where}: unknown step kind {kind!r:.60}")
    return _build_dataclass(EVENT_TYPES[value["kind"]], value, where, strict)


def from_dict(data: Any, vocab_size: int | None = None) -> Trace:
    """Validate and rebuild a Trace; raise TraceFormatError naming the first problem."""
    if not isinstance(data, dict):
        raise TraceFormatError("a trace must be a JSON object")
    major, minor = _major_minor(data.get("schema_version"))
    our_major, our_minor = _major_minor(SCHEMA_VERSION)
    if major != our_major:
        raise TraceFormatError(f"schema_version={data.get('schema_version')!r} is not supported "
                               f"(this version reads {our_major}.x)")
    strict = minor <= our_minor
    body = dict(data)
    steps = body.pop("steps", None)
    if not isinstance(steps, list):
        raise TraceFormatError("trace.steps: expected a list")
    body["steps"] = []
    trace = _build_dataclass(Trace, body, "trace", strict)
    built = tuple(_build_event(s, f"trace.steps[{i}]", strict) for i, s in enumerate(steps))
    _check_ids(data, vocab_size)
    return dataclasses.replace(trace, steps=built)


ID_FIELDS = frozenset({"token_id", "chosen_id", "final_id", "next_token"})              # one token id
ID_LIST_FIELDS = frozenset({"prompt_ids", "forced_ids", "output_ids", "emitted", "token_ids", "ngram"})


def _check_ids(data: dict, vocab_size: int | None) -> None:
    """Every token id in the trace (top level and steps) must be in [0, vocab): the vocabulary given,
    else the one the trace's own model records."""
    if vocab_size is None:
        model = data.get("model")
        recorded = model.get("vocab_size") if isinstance(model, dict) else None
        vocab_size = recorded if isinstance(recorded, int) and recorded > 0 else None
    tokens = {k: v for k, v in data.items() if k not in ("config", "model")}   # free-form, no ids
    for where, tok in _token_ids(tokens, "trace"):
        if tok < 0 or (vocab_size is not None and tok >= vocab_size):
            raise TraceFormatError(f"{where}={tok} is out of range"
                                   + (f" (the model has {vocab_size} tokens)" if vocab_size else " (negative)"))


def _token_ids(value: Any, where: str):
    """(path, id) for every integer under a token-id field of the plain-JSON `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}"
            if key in ID_FIELDS and isinstance(item, int):
                yield path, item
            elif key in ID_LIST_FIELDS and isinstance(item, list):
                yield from ((f"{path}[{i}]", t) for i, t in enumerate(item) if isinstance(t, int))
            else:
                yield from _token_ids(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _token_ids(item, f"{where}[{i}]")


def from_json(text: str | bytes, vocab_size: int | None = None) -> Trace:
    """Load a trace; raise TraceFormatError for a file over MAX_TRACE_BYTES, not JSON, or not a trace."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceFormatError(f"trace size={len(text)} bytes is over the {MAX_TRACE_BYTES} byte limit "
                               f"({MAX_TRACE_BYTES / 2**20:g} MiB)")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TraceFormatError(f"not valid JSON: {err}") from None
    except RecursionError:
        raise TraceFormatError("not a trace: JSON nested too deeply") from None
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
