"""A growing answer's text, handed out in pieces whose concatenation is the whole answer's text.

A token may end in the middle of a character (byte-level vocabularies split UTF-8): the text of the ids so
far then ends in U+FFFD, and that piece waits for the next token. The answer's text leaves out a final
end-of-sequence token (the reply says finish_reason "stop" instead)."""
from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

PARTIAL = "\ufffd"


def answer_ids(ids: Sequence[int], eos_ids: Collection[int]) -> list[int]:
    """The ids whose text is the answer: all of them but a final end-of-sequence token."""
    return list(ids[:-1]) if ids and ids[-1] in eos_ids else list(ids)


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], eos_ids: Collection[int]):
        self._decode, self._eos = decode, eos_ids
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: Sequence[int]) -> str:
        """The new text once `ids` are added ("" while a character is incomplete)."""
        self.ids.extend(int(t) for t in ids)
        text = self._decode(answer_ids(self.ids, self._eos))
        if text.endswith(PARTIAL) or not text.startswith(self.sent):
            return ""
        return self._hand_out(text)

    def finish(self, text: str) -> str:
        """What is left of the whole answer `text` (the one the unstreamed reply carries)."""
        return self._hand_out(text) if text.startswith(self.sent) else ""

    def _hand_out(self, text: str) -> str:
        piece, self.sent = text[len(self.sent):], text
        return piece
