"""The target's answers to the distillation prompts as a compact file: token ids only (uint16 where the
vocabulary fits, else uint32), compressed. Generating answers is the slow part of distillation (the
target decodes every token); the hidden states and soft labels are one teacher-forced forward over
prompt + answer, so a machine with the answers file recomputes only those. Files are keyed like the
distillation cache (decoding.train.data.distill_key) and looked up in assets/distill/ (shipped) before
the user cache, so parts can be generated on any machine, over several sessions, and shipped."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from decoding.core.errors import check
from decoding.runtime.files import atomic_path, load_from_cache
from decoding.runtime.paths import SHIPPED_ANSWERS, cache_dir, shown_path

ANSWERS_VERSION = 1
SHIPPED = SHIPPED_ANSWERS


@dataclass(frozen=True)
class AnswerSet:
    prompts: tuple[tuple[int, ...], ...]
    answers: tuple[tuple[int, ...], ...]    # each ends at its EOS (included) or at the answer budget
    info: dict                              # model, key, generation settings, seconds

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        top = max([t for seq in self.prompts + self.answers for t in seq], default=0)
        dtype = np.uint16 if top < 2 ** 16 else np.uint32
        arrays = {f"{name}_{part}": values for name in ("prompts", "answers")
                  for part, values in zip(("tokens", "offsets"), _flat(getattr(self, name), dtype))}
        meta = json.dumps({"version": ANSWERS_VERSION, **self.info})
        with atomic_path(path) as tmp, open(tmp, "wb") as file:
            np.savez_compressed(file, meta=np.array(meta), **arrays)

    @classmethod
    def load(cls, path: Path) -> AnswerSet:
        with np.load(path, allow_pickle=False) as data:
            info = json.loads(str(data["meta"]))
            check(info.pop("version", None) == ANSWERS_VERSION, "answers", shown_path(path),
                  f"is not an answers file of version {ANSWERS_VERSION}")
            prompts, answers = (_unflat(data[f"{name}_tokens"], data[f"{name}_offsets"])
                                for name in ("prompts", "answers"))
        return cls(prompts, answers, info)


def _flat(seqs: Sequence[Sequence[int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    tokens = np.fromiter((t for s in seqs for t in s), dtype=dtype, count=int(offsets[-1]))
    return tokens, offsets


def _unflat(tokens: np.ndarray, offsets: np.ndarray) -> tuple[tuple[int, ...], ...]:
    values = tokens.astype(np.int64).tolist()
    return tuple(tuple(values[int(a):int(b)]) for a, b in zip(offsets[:-1], offsets[1:]))


def file_name(key: str) -> str:
    return f"answers-{key}.npz"


def find(key: str) -> Path | None:
    """The answers file for a distillation key: the shipped one first, then the user cache's."""
    for folder in (SHIPPED, cache_dir("distill")):
        path = folder / file_name(key)
        if path.is_file():
            return path
    return None


def load_matching(key: str, prompts: Sequence[Sequence[int]]) -> AnswerSet | None:
    """The stored answers for `key` when their prompts are these prompts (else None: generate again)."""
    path = find(key)
    if path is None:
        return None
    stored = load_from_cache(AnswerSet.load, path)       # a damaged file: generate again
    if stored is None or stored.prompts != tuple(tuple(int(t) for t in p) for p in prompts):
        return None
    return AnswerSet(stored.prompts, stored.answers, {**stored.info, "source": path.name})
