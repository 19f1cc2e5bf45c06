"""What the drafter names stand for, part by part: the draft models and trained nets they load, the sources
they build, how a trace names them, and what "auto" means on a model (`auto_fits`). Which of them a run
uses is decoding.drafters.resolve's."""
from __future__ import annotations

from pathlib import Path

from decoding.core.config import (
    AUTO_DRAFT,
    FEATURE_HEAD,
    LOOKUP,
    LOOKUP_THEN,
    PARALLEL_ALIASES,
    PARALLEL_DRAFTER,
    SHALLOW_DRAFT,
    TRAINING_FREE,
    names_kind,
    trained_kind,
    training_free_names,
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
from decoding.drafters.model_source import MODEL_PREFIX, DraftModelSource
from decoding.drafters.parallel import load_drafter
from decoding.drafters.recycling import RECYCLING, RecyclingSource
from decoding.drafters.source_chain import SourceChainDrafter
from decoding.drafters.suffix import SUFFIX, SuffixSource
from decoding.runtime.engine_thread import ENGINE
from decoding.runtime.fingerprint import shipped_fits
from decoding.runtime.models import LM
from decoding.runtime.paths import FEATURE_WEIGHTS, PARALLEL_WEIGHTS, calibration_path


def load_draft(name: str, target: LM, **spec):
    """Load a draft model by id or path (ModelSpec fields in `spec`), build the shallow self-draft
    ("shallow": the shipped weights; "shallow:PATH": a weights file) on the target, or load the feature
    drafter ("feature", "feature:PATH"; a decoding.drafters.feature_net.FeatureNet, not an LM); errors name `draft`
    and the name as given ("feature:PATH", not the file alone)."""
    from decoding.drafters.feature_net import load_feature
    from decoding.drafters.shallow import load_shallow
    from decoding.runtime.models import ModelSpec, load

    if name == AUTO_DRAFT:          # the shipped feature drafter where it was trained for this model, else none
        return ENGINE.call(load_feature, target, None) if auto_fits(target)[0] else None
    for kind, loader in ((SHALLOW_DRAFT, load_shallow), (FEATURE_HEAD, load_feature)):
        if names_kind(name, kind):
            try:
                return ENGINE.call(loader, target, name[len(kind) + 1:] or None)
            except ConfigError as err:       # about its file: named as the user gave it ("feature:FILE")
                if err.param == "draft":
                    raise ConfigError("draft", name, err.expected) from None
                raise
    try:
        draft = load(ModelSpec(name=name, **spec))
    except ConfigError as err:
        detail = err.expected if err.param == "model" else f"could not be loaded ({err})"
        raise ConfigError("draft", name, detail) from None
    check_compatible(draft, target)
    return draft


def training_free_sources(target: LM, names, memory: SourceMemory) -> list:
    """Fresh tree sources for one run, by name ("recycling", "suffix", "model:ID"); recycling and suffix
    read and fill `memory` (the run's, decoding/drafters/memory.py), a draft model is the target's (loaded once)."""
    made = {RECYCLING: lambda: RecyclingSource(memory.recycling_table(target.vocab_size)),
            SUFFIX: lambda: SuffixSource(memory.suffix_store())}
    return [made[name]() if name in made else draft_model_source(target, name[len(MODEL_PREFIX):]) for name in names]


def draft_model_source(target: LM, name: str) -> DraftModelSource:
    """The draft model `name` as a lattice source; errors name `drafter`. A target keeps one such draft model,
    the last one named (a config names at most one; another name replaces it, so that links naming many
    cannot pile up copies on a shared server)."""
    try:
        draft = target.loaded(("draft model source",), name, lambda: load_draft(name, target))
    except ConfigError as err:
        raise ConfigError("drafter", MODEL_PREFIX + name, err.expected) from None
    check(not isinstance(draft, FeatureNet) and draft is not None, "drafter", MODEL_PREFIX + name,
          "must name a causal LM with the target's vocabulary (a trained drafter goes first: feature+model:ID)")
    return DraftModelSource(DraftModelDrafter(draft, target))


def make_drafter(draft: str, target: LM, *, draft_lm=None, max_ngram: int = 2,
                 memory: SourceMemory | None = None) -> LatticeSource:
    """The drafter a config names: 'lookup', 'recycling' (token recycling's chain, any model, from the run's
    `memory`; None: a new, empty one), the draft model the caller loaded (`draft_lm`: an LM, or a FeatureNet from
    load_draft('feature')), 'lookup+X' (prompt lookup, else X), or 'auto': 'lookup+feature' with the shipped
    feature drafter loaded by load_draft('auto'), 'lookup+recycling' where none fits the model (draft_lm
    None). One source alone is returned as it is (speculative decoding composes it), several behind the
    composer."""
    if draft == LOOKUP:
        return PromptLookupDrafter(max_ngram, target.eos_ids)
    if draft == AUTO_DRAFT:
        draft = LOOKUP_THEN + (FEATURE_HEAD if draft_lm is not None else TRAINING_FREE[0])
    lookup_first = draft.startswith(LOOKUP_THEN)
    names = training_free_names(draft[len(LOOKUP_THEN):] if lookup_first else draft)
    if names:
        model = training_free_sources(target, names, memory or SourceMemory())
    elif draft_lm is None:
        raise ConfigError("draft", draft, "no draft model was loaded for it: load it and pass draft_lm=")
    elif isinstance(draft_lm, FeatureNet):
        model = AttendingDrafter(draft_lm) if draft_lm.attends else FeatureDrafter(draft_lm)
    else:
        model = DraftModelDrafter(draft_lm, target)
    if lookup_first:
        return LookupThenDraftDrafter(PromptLookupDrafter(max_ngram, target.eos_ids), model)
    return SourceChainDrafter(model) if names else model


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
    """DSpark's trained drafter `name` stands for (the feature head or a parallel drafter), loaded once per
    model and version of its files (a retrained file at the same path loads anew); errors name `drafter`.
    A model keeps one drafter of each kind, the last one named (links naming many files cannot pile up
    drafters on a shared server)."""
    path = named_weights(name)
    version = name, file_stamp(path), file_stamp(calibration_path(path))
    try:
        if trained_kind(name) == FEATURE_HEAD:
            return lm.loaded(("dspark drafter", FEATURE_HEAD), version, lambda: load_feature_lattice(lm, path))
        return lm.loaded(("dspark drafter", PARALLEL_DRAFTER), version, lambda: load_drafter(path, lm))
    except ConfigError as err:
        if err.param == "draft" or (err.param == "drafter" and err.value != name):   # name the drafter as given
            raise ConfigError("drafter", name, err.expected) from None
        raise


def named_weights(name: str) -> Path:
    """The weights file a drafter name stands for: "feature" and "parallel" the shipped ones,
    "feature:FILE" and "parallel:FILE" (or a bare FILE: a parallel drafter) a trained one."""
    if name == FEATURE_HEAD:
        return FEATURE_WEIGHTS
    if name in PARALLEL_ALIASES:
        return PARALLEL_WEIGHTS
    for kind in (FEATURE_HEAD, PARALLEL_DRAFTER):
        if name.startswith(kind + ":"):
            return Path(name[len(kind) + 1:]).expanduser()
    return Path(name).expanduser()


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(modification time in ns, size) of a file; None when there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
