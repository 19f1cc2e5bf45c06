"""Drafter names: one grammar for speculative decoding's `draft` and DSpark's `drafter` (docs/drafters.md,
"Drafter names", has the table).

A name is one part or several joined by "+". Each word is defined once, here:

    auto               the shipped trained drafter where it was trained for the model, else training-free
    lookup             prompt lookup (speculative decoding; DSpark sets it with lookup_max_ngram)
    recycling, suffix  token recycling, suffix matching: training-free tree sources
    model:ID           a draft model with the target's vocabulary (an id or a path)
    feature[:FILE]     the feature drafter (the shipped weights, or FILE)
    shallow[:FILE]     the shallow self-draft (speculative decoding)
    parallel[:FILE]    the parallel drafter (DSpark)

A part that is none of these is a bare name: speculative decoding reads it as a draft model id or path
(`model:ID` without the prefix), DSpark as a parallel drafter's weights file (`parallel:FILE`; "default" is an
older name of the shipped one). A FILE, an ID or a bare name runs on to the next word, "+" included:
"model:/m/a+b+recycling" is the model /m/a+b, then token recycling. `read_draft` and `read_drafter` say what a
name stands for in each strategy and refuse, in one line naming the parameter and the name, a part that the
strategy cannot use.
"""
from __future__ import annotations

from dataclasses import dataclass

from decoding.core.errors import ConfigError

AUTO = "auto"
LOOKUP = "lookup"
RECYCLING = "recycling"                # token recycling (drafters/recycling.py), for any model
SUFFIX = "suffix"                      # suffix matching over the run's memory (drafters/suffix.py)
TRAINING_FREE = (RECYCLING, SUFFIX)    # sources that need no files and learn as they go (drafters/memory.py)
DRAFT_MODEL = "model"                  # "model:ID"; how a trace names a draft model
FEATURE_HEAD = "feature"               # the feature drafter (speculative), as a sequential head (DSpark)
SHALLOW_DRAFT = "shallow"              # the shallow self-draft (speculative decoding)
PARALLEL_DRAFTER = "parallel"          # the parallel drafter (DSpark)
PARALLEL_ALIAS = "default"             # DSpark: an older name of the shipped parallel drafter
BARE = "bare"                          # a part that is no word: each strategy says what it is
LOADED = (DRAFT_MODEL, FEATURE_HEAD, SHALLOW_DRAFT, PARALLEL_DRAFTER)   # words that take ":FILE" / ":ID"
WORDS = (AUTO, LOOKUP, *TRAINING_FREE, FEATURE_HEAD, SHALLOW_DRAFT, PARALLEL_DRAFTER)   # words that stand alone
LOOKUP_THEN = LOOKUP + "+"             # speculative "lookup+MODEL": prompt lookup, else MODEL


@dataclass(frozen=True)
class Part:
    """One part of a name: `kind` (a word, or BARE), `arg` (FILE or ID after "kind:", or a bare name; None:
    the shipped weights, or a word without one) and `text`, the part as written."""

    kind: str
    arg: str | None = None
    text: str = ""

    @property
    def shipped(self) -> bool:
        """A trained drafter's shipped weights ("feature", "feature:", "default"), not a FILE."""
        return not self.arg

    def extended(self, piece: str) -> Part:
        return Part(self.kind, f"{self.arg}+{piece}", f"{self.text}+{piece}")

    def takes_rest(self) -> bool:
        """Whether a following piece that is no word belongs to this part's FILE, ID or bare name."""
        return self.kind == BARE or self.arg is not None


def split_parts(name: str) -> tuple[Part, ...]:
    """The parts of `name`, the same for both strategies (a bare part stays BARE)."""
    parts: list[Part] = []
    for piece in name.split("+"):
        part = _word_part(piece)
        if part is None and parts and parts[-1].takes_rest():
            parts[-1] = parts[-1].extended(piece)
        else:
            parts.append(part or Part(BARE, piece, piece))
    return tuple(parts)


def _word_part(piece: str) -> Part | None:
    if piece in WORDS:
        return Part(piece, None, piece)
    word, colon, arg = piece.partition(":")
    return Part(word, arg, piece) if colon and word in LOADED else None


@dataclass(frozen=True)
class DraftSpec:
    """What a name stands for in one strategy: "auto", or prompt lookup first (speculative), the one drafter
    that needs loading (`trained`: a draft model, a feature, shallow or parallel drafter) and the tree sources
    (`sources`: recycling, suffix; DSpark also model:ID), each in the order written."""

    name: str
    auto: bool = False
    lookup: bool = False
    trained: Part | None = None
    sources: tuple[Part, ...] = ()

    @property
    def trace_names(self) -> tuple[str, ...]:
        """How a trace names the sources, in drafting order ('model' for a draft model)."""
        head = (LOOKUP,) if self.lookup else ()
        return head + ((self.trained.kind,) if self.trained else ()) + tuple(p.kind for p in self.sources)


def read_draft(name: str) -> DraftSpec:
    """What speculative decoding's `draft` names: "auto"; or ["lookup+"] then one draft model (a bare name or
    model:ID), feature or shallow drafter, or training-free sources ("recycling+suffix"); or "lookup" alone."""
    parts = split_parts(name)
    if [p.kind for p in parts] == [AUTO]:
        return DraftSpec(name, auto=True)
    lookup = parts[0].kind == LOOKUP
    rest = list(parts[1:] if lookup else parts)
    if lookup and (not rest or rest[0].kind in (AUTO, LOOKUP) or _empty(rest[0])):
        if rest:
            _refuse("draft", name, f"give a draft model after '{LOOKUP_THEN}' (e.g. '{LOOKUP_THEN}shallow')")
        return DraftSpec(name, lookup=True)
    _common_refusals("draft", name, rest)
    _refuse_kinds("draft", name, rest, {
        LOOKUP: f"prompt lookup goes first ('{LOOKUP_THEN}…')",
        PARALLEL_DRAFTER: "the parallel drafter drafts DSpark's lattice, not speculative decoding's chain"})
    rest = [Part(DRAFT_MODEL, p.arg, p.text) if p.kind == BARE else p for p in rest]
    trained = [p for p in rest if p.kind in LOADED]
    if len(trained) > 1:
        _refuse("draft", name, "names more than one drafter to load")
    if trained and len(rest) > 1:
        _refuse("draft", name, "names one drafter to load or training-free sources (recycling, suffix), not both")
    return DraftSpec(name, lookup=lookup, trained=trained[0] if trained else None,
                     sources=tuple(p for p in rest if p.kind in TRAINING_FREE))


def read_drafter(name: str) -> DraftSpec:
    """What DSpark's `drafter` names: "auto"; or at most one trained drafter (feature[:FILE], parallel[:FILE], a
    bare FILE: a parallel drafter), first, then tree sources (recycling, suffix, one model:ID)."""
    parts = list(split_parts(name))
    if [p.kind for p in parts] == [AUTO]:
        return DraftSpec(name, auto=True)
    _common_refusals("drafter", name, parts)
    _refuse_kinds("drafter", name, parts, {
        LOOKUP: "prompt lookup is DSpark's lookup_max_ngram, not a drafter part",
        SHALLOW_DRAFT: "the shallow self-draft drafts speculative decoding's chain only"})
    parts = [_dspark_bare(p) if p.kind == BARE else p for p in parts]
    trained = [p for p in parts if p.kind in (FEATURE_HEAD, PARALLEL_DRAFTER)]
    if len(trained) > 1 or (trained and parts[0] is not trained[0]):
        _refuse("drafter", name, "names one trained drafter, first (e.g. 'feature+recycling')")
    if sum(p.kind == DRAFT_MODEL for p in parts) > 1:
        _refuse("drafter", name, "names more than one draft model (model:ID)")
    return DraftSpec(name, trained=trained[0] if trained else None, sources=tuple(parts[len(trained):]))


def _dspark_bare(part: Part) -> Part:
    """A bare DSpark part: a parallel drafter's weights file ("default": the shipped one)."""
    return Part(PARALLEL_DRAFTER, None if part.arg == PARALLEL_ALIAS else part.arg, part.text)


def _empty(part: Part) -> bool:
    """A bare name or a model:ID with nothing in it."""
    return part.kind in (BARE, DRAFT_MODEL) and not (part.arg or "").strip()


def _common_refusals(param: str, name: str, parts: list[Part]) -> None:
    """What neither strategy takes: "auto" with other parts, an empty part, a source named twice."""
    if any(p.kind == AUTO for p in parts):
        _refuse(param, name, f"'{AUTO}' stands alone (it picks the sources by the model)")
    if any(map(_empty, parts)):
        _refuse(param, name, "has an empty part (give an id or a file after 'model:', a name between '+')")
    if len({p.text for p in parts}) < len(parts):
        _refuse(param, name, "names a source twice")


def _refuse_kinds(param: str, name: str, parts: list[Part], why: dict[str, str]) -> None:
    for part in parts:
        if part.kind in why:
            _refuse(param, name, why[part.kind])


def _refuse(param: str, name: str, expected: str) -> None:
    raise ConfigError(param, name, expected)
