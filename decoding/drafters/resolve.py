"""The one resolver: a config's drafter name, and what a run is handed as `drafter=`, -> the run's sources and
what its trace records of them (`Drafting`). Both strategies' `decode` and the app's "resolves to" caption
(decoding.runner.planned_drafting) read names here, so a name means the same everywhere.

Names: speculative decoding's `draft` and DSpark's `drafter` are read by one grammar (decoding.core.draft_names:
"auto", "lookup+MODEL", "recycling+suffix", "feature:FILE+recycling", "model:ID", ...). "auto" is decided in one
place (`auto_fits`): the shipped feature drafter where it was trained for the model, else token recycling.

`drafter=` means the same in both strategies: a LatticeSource (a source, or several behind their composer) is
the run's drafter as given (DSpark still adds prompt lookup's chain as lookup_max_ngram says, inside a source
that scores its own lattice); a loaded model or net takes the place of the part of the name that needs
loading (speculative: the draft model or feature drafter; DSpark: the trained drafter), the name's other
parts as the name says. Without `drafter=`, the run loads what its name needs (once per model).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from decoding.core.config import BaseConfig, DSparkConfig
from decoding.core.draft_names import (
    AUTO,
    FEATURE_HEAD,
    LOOKUP,
    LOOKUP_THEN,
    RECYCLING,
    Part,
    read_draft,
    read_drafter,
)
from decoding.core.errors import check
from decoding.core.trace import DraftingInfo
from decoding.drafters.factory import (
    auto_fits,
    drafting_info,
    file_stamp,
    load_draft,
    load_lattice_drafter,
    make_drafter,
    training_free_sources,
)
from decoding.drafters.feature_lattice import FeatureLatticeDrafter
from decoding.drafters.feature_net import FeatureNet
from decoding.drafters.lattice_bases import LookupChainSource, TrainedSource
from decoding.drafters.lattice_source import LatticeSource
from decoding.drafters.memory import SourceMemory, planned_memory, run_memory
from decoding.drafters.parallel import ParallelDrafter
from decoding.drafters.source_chain import SourceChainDrafter
from decoding.runtime.models import LM
from decoding.runtime.paths import FEATURE_WEIGHTS

GIVEN = "the drafter passed in"
TRAINED_NETS = (ParallelDrafter, FeatureLatticeDrafter)     # DSpark's trained drafters, wrapped by TrainedSource


@dataclass(frozen=True)
class Drafting:
    """A run's sources, in drafting order, and what its trace records of them; `timing_key`: what a DSpark
    round's overhead is timed once per (the trained net the sources wrap; None: the target model's)."""

    sources: tuple[LatticeSource, ...]
    info: DraftingInfo
    timing_key: object | None = None

    @property
    def chain(self) -> LatticeSource:
        """The sources as one drafter (speculative decoding's): the single source, or their composer."""
        return self.sources[0] if len(self.sources) == 1 else SourceChainDrafter(self.sources)


def resolve(lm: LM, config: BaseConfig, drafter=None, memory: SourceMemory | None = None) -> Drafting:
    """The sources a run of `config` on `lm` drafts with: its name's, with `drafter=` as the module says;
    token recycling and suffix matching draft from `memory` (None: an empty one of this run's own)."""
    if isinstance(config, DSparkConfig):
        return _lattice_sources(lm, config, drafter, memory)
    return _chain_sources(lm, config, drafter, memory)


def planned_drafting(lm: LM, config: BaseConfig) -> DraftingInfo:
    """What a run of `config` on `lm` given no drafter and no memory will record of its sources (resolve),
    without loading any."""
    if isinstance(config, DSparkConfig):
        trained, free, reason = lattice_choice(lm, config.drafter, None)
        trained_names = (trained.kind,) if trained else ()
        return planned_memory(lattice_info(trained_names, config.lookup_max_ngram > 0, free, reason))
    return planned_memory(chain_choice(lm, config.draft)[1])


# ------------------------------------------------------------------------------ speculative decoding's chain
def chain_choice(lm: LM, draft: str) -> tuple[str, DraftingInfo]:
    """The draft name a speculative run uses on `lm` ('auto' resolved) and what its trace records of it."""
    if draft == AUTO:
        fits, reason = auto_fits(lm)
        resolved = LOOKUP_THEN + (FEATURE_HEAD if fits else RECYCLING)
    else:
        resolved, reason = draft, f"draft {draft!r} as set"
    return resolved, drafting_info(read_draft(resolved).trace_names, reason)


def _chain_sources(lm: LM, config, drafter, memory: SourceMemory | None) -> Drafting:
    if isinstance(drafter, LatticeSource):
        check(not any(part.takes_lookup for part in drafter.parts), "drafter", drafter.name,
              "scores a DSpark lattice from the target's hidden rows: speculative decoding cannot draft with it")
        return Drafting((drafter,), drafting_info([source.name for source in drafter.parts], GIVEN))
    check(drafter is None or isinstance(drafter, (LM, FeatureNet)), "drafter", type(drafter).__name__,
          "cannot draft speculative decoding's chain: give a source, a draft model or a feature drafter")
    draft, info = chain_choice(lm, config.draft)
    memory, info = run_memory(memory, lm, info)
    if drafter is None:
        drafter = named_draft(lm, config.draft, draft)
    made = make_drafter(draft, lm, drafter=drafter, max_ngram=config.lookup_max_ngram, memory=memory)
    return Drafting((made,), info)


def named_draft(lm: LM, name: str, resolved: str):
    """What a speculative draft name needs loaded, loaded once per model and version of its file: for "auto"
    (resolved as `resolved`) the shipped feature drafter where it fits; the name's draft model, feature or
    shallow drafter; None for prompt lookup and the training-free sources."""
    if name == AUTO:
        return shipped_feature(lm) if resolved == LOOKUP_THEN + FEATURE_HEAD else None
    part = read_draft(name).trained
    if part is None:
        return None
    stamp = file_stamp(Path(part.arg).expanduser()) if part.arg else None
    return lm.loaded(("speculative draft",), (part.text, stamp), lambda: load_draft(part.text, lm))


def shipped_feature(target: LM):
    """The shipped feature drafter for "auto" where it was trained for the model (None elsewhere), loaded once
    per model and version of its file."""
    return target.loaded(("speculative draft", AUTO), file_stamp(FEATURE_WEIGHTS),
                         lambda: load_draft(AUTO, target))


# ------------------------------------------------------------------------------ DSpark's lattice
AUTO_HEAD = Part(FEATURE_HEAD, None, FEATURE_HEAD)     # "auto" where the shipped feature drafter fits
AUTO_WITH_TRAINED: tuple[Part, ...] = ()               # training-free sources "auto" adds to the shipped head
AUTO_FREE_SOURCES = (Part(RECYCLING, None, RECYCLING),)   # "auto" on any other model


def lattice_choice(lm: LM, name: str, given) -> tuple[Part | None, tuple[Part, ...], str]:
    """(the trained drafter's part, the tree sources' parts, why) a DSpark drafter name stands for on `lm`,
    with `given` (the drafter passed in, or None) in the trained drafter's place."""
    spec = read_drafter(name)
    if not spec.auto:
        return spec.trained, spec.sources, f"drafter {name!r} as set"
    if given is not None:
        return None, AUTO_WITH_TRAINED, "auto: " + GIVEN
    fits, reason = auto_fits(lm)
    return (AUTO_HEAD, AUTO_WITH_TRAINED, reason) if fits else (None, AUTO_FREE_SOURCES, reason)


def lattice_info(trained: tuple[str, ...], lookup: bool, free: Sequence[Part], reason: str) -> DraftingInfo:
    """The trace's `drafting`: the trained drafter, prompt lookup, then the tree sources, in lattice order."""
    return drafting_info(trained + ((LOOKUP,) if lookup else ()) + tuple(part.kind for part in free), reason)


def _lattice_sources(lm: LM, config: DSparkConfig, drafter, memory: SourceMemory | None) -> Drafting:
    if isinstance(drafter, LatticeSource):
        return _given_lattice(lm, config, drafter)
    check(drafter is None or isinstance(drafter, TRAINED_NETS), "drafter", type(drafter).__name__,
          "is not a DSpark drafter: give a source, a parallel drafter or a feature head")
    trained, free, reason = lattice_choice(lm, config.drafter, drafter)
    whose = GIVEN if drafter is not None else f"drafter {config.drafter!r}"   # as given
    if drafter is None and trained is not None:
        drafter = load_lattice_drafter(lm, trained.text)
    base = [trained_source(lm, drafter, config.gamma, whose)] if drafter is not None else []
    lookup = config.lookup_max_ngram > 0
    memory, info = run_memory(memory, lm, lattice_info(tuple(s.name for s in base), lookup, free, reason))
    base = base or ([LookupChainSource()] if lookup else [])
    return Drafting(tuple(base + training_free_sources(lm, free, memory)), info, drafter)


def _given_lattice(lm: LM, config: DSparkConfig, drafter: LatticeSource) -> Drafting:
    """A source passed in as the whole drafter, with prompt lookup's chain (lookup_max_ngram > 0): inside the
    source that scores its own lattice, else as the base."""
    parts = drafter.parts
    check(not any(part.draws_chains for part in parts), "drafter", drafter.name,
          "draws speculative decoding's chains: DSpark drafts with tree and lattice sources")
    trained = [part.drafter for part in parts if isinstance(part, TrainedSource)]
    for net in trained:
        trained_source(lm, net, config.gamma, GIVEN)
    names = [part.name for part in parts]
    inside = next((i + 1 for i, part in enumerate(parts) if part.takes_lookup), None)
    if config.lookup_max_ngram > 0:
        names.insert(inside or 0, LOOKUP)
    base = (LookupChainSource(),) if config.lookup_max_ngram > 0 and inside is None else ()
    return Drafting(base + parts, drafting_info(names, GIVEN), trained[0] if trained else None)


def trained_source(lm: LM, drafter, gamma: int, whose: str) -> TrainedSource:
    """A trained DSpark drafter as its source, attached to `lm` where it has no head yet, refused where it was
    trained for another vocabulary or γ exceeds its gamma_max (`whose` names it in the message)."""
    if isinstance(drafter, ParallelDrafter) and drafter.head is None:
        drafter.attach(lm)
    check(drafter.shape.vocab_size == lm.vocab_size, "drafter", f"<vocab {drafter.shape.vocab_size}>",
          f"was trained for another model (this one has vocab {lm.vocab_size})")
    check(gamma <= drafter.shape.gamma_max, "gamma", gamma, f"must be <= the gamma_max ({drafter.shape.gamma_max}) "
                                                           f"of {whose}")
    return TrainedSource(drafter)
