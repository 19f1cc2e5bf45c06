"""DSpark's lattice sources in words: who proposed a cell or a plan node, and which sources a run used."""
from __future__ import annotations

from decoding.core.trace import proposed_by

SOURCE_LABELS = {"feature": "feature head", "parallel": "parallel drafter", "lookup": "prompt lookup",
                 "recycling": "token recycling", "suffix": "suffix matching", "model": "draft model",
                 "shallow": "shallow self-draft",
                 "drafter": "drafter"}


def source_label(name: str) -> str:
    return SOURCE_LABELS.get(name, name)


def source_text(item) -> str:
    """'feature head + prompt lookup': the sources of a lattice cell or plan node (older traces: lookup or not)."""
    return " + ".join(source_label(name) for name in proposed_by(item))


def drafting_text(info, speculative: bool = False) -> str:
    """One line: the run's sources and why (a DSpark prefill round's or a first speculative round's
    `drafting`, or what a config will use: decoding.runner.planned_drafting). Speculative decoding drafts
    a chain, not a lattice: its line says "Draft sources"."""
    names = ", ".join(source_label(name) for name in info.sources) or "none"
    label = "Draft sources" if speculative else "Lattice sources"
    return f"{label}: {names}. {info.reason}" + memory_text(getattr(info, "memory", ""))


def memory_text(memory: str) -> str:
    """What token recycling and suffix matching started from ("" when neither ran): nothing but this run's
    own text, or what the earlier runs given the same memory left (the Python API's `memory=`)."""
    if memory == "empty":
        return " Their memory starts empty: they learn from this run's text only."
    return f" Their memory holds what {memory} left." if memory else ""


def drafter_words(name: str) -> str:
    """A drafter's name in words: "default[feature]" -> "feature head (over default)"; others unchanged."""
    model, bracket, rest = name.partition("[")
    kind, closed, tail = rest.partition("]")
    if not (bracket and closed and kind):
        return name
    return f"{source_label(kind)} (over {model or 'the model'}){tail}"
