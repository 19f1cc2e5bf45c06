"""What the drafter names stand for, part by part: the draft models and trained nets they load, the sources
they build, how a trace names them, and what "auto" means on a model (`auto_fits`). Which of them a run
uses is decoding.drafters.resolve's."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from decoding.core.draft_names import (
    AUTO,
    DRAFT_MODEL,
    FEATURE_HEAD,
    LOOKUP_THEN,
    PARALLEL_DRAFTER,
    RECYCLING,
    SHALLOW_DRAFT,
    SUFFIX,
    Part,
    read_draft,
    read_drafter,
)
from decoding.core.errors import ConfigError, check
from decoding.core.trace import DraftingInfo
from decoding.core.trace_check import MAX_DRAFTING_REASON, MAX_SOURCE_NAME
from decoding.drafters.draft_model import DraftModelDrafter, check_compatible
from decoding.drafters.feature import AttendingDrafter, FeatureDrafter
from decoding.drafters.feature_lattice import load_feature_lattice
from decoding.drafters.feature_net import FeatureNet
from decoding.drafters.lattice_source import LatticeSource
from decoding.drafters.lookup import LookupThenDraftDrafter, PromptLookupDrafter
from decoding.drafters.memory import SourceMemory
from decoding.drafters.model_source import DraftModelSource
from decoding.drafters.parallel import load_drafter
from decoding.drafters.recycling import RecyclingSource
from decoding.drafters.source_chain import SourceChainDrafter
from decoding.drafters.suffix import SuffixSource
from decoding.runtime.engine_thread import ENGINE
from decoding.runtime.fingerprint import shipped_fits
from decoding.runtime.models import LM
from decoding.runtime.paths import FEATURE_WEIGHTS, PARALLEL_WEIGHTS, calibration_path


def load_draft(name: str, target: LM, **spec):
    """Load what a speculative draft name's part needs (SpeculativeConfig.draft_model): a draft model by id or
    path ("model:ID" or the ID alone; ModelSpec fields in `spec`), the shallow self-draft built on the target
    ("shallow": the shipped weights; "shallow:PATH": a weights file), or the feature drafter ("feature",
    "feature:PATH"; a decoding.drafters.feature_net.FeatureNet, not an LM); "auto": the shipped feature drafter
    where it was trained for the model, else None. Errors name `draft` and the name as given ("feature:PATH",
    not the file alone)."""
    from decoding.drafters.feature_net import load_feature
    from decoding.drafters.shallow import load_shallow
    from decoding.runtime.models import ModelSpec, load

    if name == AUTO:          # the shipped feature drafter where it was trained for this model, else none
        return ENGINE.call(load_feature, target, None) if auto_fits(target)[0] else None
    part = read_draft(name).trained
    check(part is not None, "draft", name, "names no draft model or trained drafter to load")
    loader = {SHALLOW_DRAFT: load_shallow, FEATURE_HEAD: load_feature}.get(part.kind)
    if loader is not None:
        try:
            return ENGINE.call(loader, target, part.arg or None)
        except ConfigError as err:       # about its file: named as the user gave it ("feature:FILE")
            if err.param == "draft":
                raise ConfigError("draft", name, err.expected) from None
            raise
    try:
        draft = load(ModelSpec(name=part.arg, **spec))
    except ConfigError as err:
        detail = err.expected if err.param == "model" else f"could not be loaded ({err})"
        raise ConfigError("draft", name, detail) from None
    check_compatible(draft, target)
    return draft


def training_free_sources(target: LM, parts: Sequence[Part], memory: SourceMemory) -> list:
    """Fresh tree sources for one run, by name part (recycling, suffix, model:ID); recycling and suffix read and
    fill `memory` (the run's, decoding/drafters/memory.py), a draft model is the target's (loaded once)."""
    made = {RECYCLING: lambda: RecyclingSource(memory.recycling_table(target.vocab_size)),
            SUFFIX: lambda: SuffixSource(memory.suffix_store())}
    return [made[p.kind]() if p.kind in made else draft_model_source(target, p.arg) for p in parts]


def draft_model_source(target: LM, name: str) -> DraftModelSource:
    """The draft model ID `name` (DSpark's "model:ID" part) as a lattice source; errors name `drafter` and the
    part. A target keeps one such draft model, the last one named (a config names at most one; another name
    replaces it, so that links naming many cannot pile up copies on a shared server)."""
    part = f"{DRAFT_MODEL}:{name}"
    try:
        draft = target.loaded(("draft model source",), name, lambda: load_draft(name, target))
    except ConfigError as err:
        raise ConfigError("drafter", part, err.expected) from None
    check(not isinstance(draft, FeatureNet) and draft is not None, "drafter", part,
          "must name a causal LM with the target's vocabulary (a trained drafter goes first: feature+model:ID)")
    return DraftModelSource(DraftModelDrafter(draft, target))


def make_drafter(draft: str, target: LM, *, drafter=None, max_ngram: int = 2,
                 memory: SourceMemory | None = None) -> LatticeSource:
    """The drafter a config names: 'lookup', 'recycling' (token recycling's chain, any model, from the run's
    `memory`; None: a new, empty one), the draft model the caller loaded (`drafter`: an LM, or a FeatureNet from
    load_draft('feature')), 'lookup+X' (prompt lookup, else X), or 'auto': 'lookup+feature' with the shipped
    feature drafter loaded by load_draft('auto'), 'lookup+recycling' where none fits the model (drafter
    None). One source alone is returned as it is (speculative decoding composes it), several behind the
    composer."""
    if draft == AUTO:
        draft = LOOKUP_THEN + (FEATURE_HEAD if drafter is not None else RECYCLING)
    spec, lookup = read_draft(draft), PromptLookupDrafter(max_ngram, target.eos_ids)
    if spec.trained is None and not spec.sources:
        return lookup
    if spec.sources:
        model = training_free_sources(target, spec.sources, memory or SourceMemory())
    elif drafter is None:
        raise ConfigError("draft", draft, "no draft model was loaded for it: load it and pass it as drafter=")
    elif isinstance(drafter, FeatureNet):
        model = AttendingDrafter(drafter) if drafter.attends else FeatureDrafter(drafter)
    else:
        model = DraftModelDrafter(drafter, target)
    if spec.lookup:
        return LookupThenDraftDrafter(lookup, model)
    return SourceChainDrafter(model) if spec.sources else model


# ------------------------------------------------------------------------------ which sources run, and why
AUTO_FITS = "auto: the shipped feature drafter was trained for this model"
AUTO_FREE = "auto: no shipped drafter was trained for this model, so training-free sources only"


def auto_fits(target: LM) -> tuple[bool, str]:
    """What "auto" means on `target`, and why: whether the shipped feature drafter was trained for it (its
    fingerprint; asked each time, the answer never cached)."""
    fits = shipped_fits(target)
    return fits, AUTO_FITS if fits else AUTO_FREE


def drafting_info(names, reason: str) -> DraftingInfo:
    """What a trace records of a run's sources: their names and why; a long name or reason (a file path)
    keeps its end, within the trace's limits."""
    return DraftingInfo(tuple(_tail(name, MAX_SOURCE_NAME) for name in names), _tail(reason, MAX_DRAFTING_REASON))


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1:]


# ------------------------------------------------------------------------------ DSpark's sources
def load_lattice_drafter(lm: LM, name: str):
    """DSpark's trained drafter `name` stands for (the feature head or a parallel drafter: the trained part of
    a drafter name), loaded once per model and version of its files (a retrained file at the same path loads
    anew); errors name `drafter`. A model keeps one drafter of each kind, the last one named (links naming
    many files cannot pile up drafters on a shared server)."""
    part = read_drafter(name).trained
    check(part is not None, "drafter", name, "names no trained drafter")
    path = named_weights(part)
    version = name, file_stamp(path), file_stamp(calibration_path(path))
    try:
        if part.kind == FEATURE_HEAD:
            return lm.loaded(("dspark drafter", FEATURE_HEAD), version, lambda: load_feature_lattice(lm, path))
        return lm.loaded(("dspark drafter", PARALLEL_DRAFTER), version, lambda: load_drafter(path, lm))
    except ConfigError as err:
        if err.param == "draft" or (err.param == "drafter" and err.value != name):   # name the drafter as given
            raise ConfigError("drafter", name, err.expected) from None
        raise


def named_weights(part: Part) -> Path:
    """The weights file a DSpark trained part stands for: "feature" and "parallel" ("default") the shipped
    ones, "feature:FILE" and "parallel:FILE" (or a bare FILE: a parallel drafter) a trained one."""
    if part.shipped:
        return FEATURE_WEIGHTS if part.kind == FEATURE_HEAD else PARALLEL_WEIGHTS
    return Path(part.arg).expanduser()


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(modification time in ns, size) of a file; None when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
