"""Untrusted text where Streamlit reads Markdown. Every string from a trace, a link or an upload that a page
passes to st.markdown, st.caption, st.error and the other calls that read Markdown (a metric's value, an
expander's label, ...) goes through md_text, so it shows as the same characters and never as a link, an
image, markup or formatting (tests/test_md_text.py holds the pages and widgets to it).

Streamlit reads Markdown in two passes (react-markdown with GFM, math and directives), and md_text blocks
both. The parser honours a backslash before ASCII punctuation: md_text escapes \\ ` * [ ] < ~ $ & everywhere
and _ outside a word (links, images, HTML, entities, emphasis, code, strikethrough, math), and the first
character where it could open a block (# - + > ... , "1." and "1)"); line breaks, and whitespace at either
end that the parser would trim, go in as numeric character references, which never start a block, so the
text is one paragraph in which the other punctuation has no meaning. Then plugins rewrite the parsed text,
escapes already undone: URLs and e-mail addresses become links, `:smile:` and `:material/...:` icons,
`:red[...]` a directive, `->` an arrow. An invisible word joiner (U+2060) breaks each such pattern: after a
colon or an @ followed by more text, between "www" and ".", and inside -> <- -- >= <= ~=. Control
characters (NUL, which Markdown reads as U+FFFD, and the others it cannot carry or trims) are given as U+FFFD."""
from __future__ import annotations

import re

WORD_JOINER = "\u2060"
_REWRITTEN = re.compile(r"(?<=[:@])(?=\S)|(?<=www)(?=\.)|(?<=[-<>~=])(?=[-<>=])", re.IGNORECASE)
_ACTIVE = re.compile(r"^[0-9]+[.)]|^[!-/:-@\[-`{-~]|[\\`*\[\]<~$&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_EDGE_SPACE = re.compile(r"^\s+|\s+$")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")          # C0 and C1 but tab, line feed, return


def _escape(match: re.Match) -> str:
    found = match.group()
    return f"{found[:-1]}\\{found[-1]}"


def _references(match: re.Match) -> str:
    return "".join(f"&#{ord(c)};" for c in match.group())


def md_text(value: object) -> str:
    """`value` as text (str(value)) that Streamlit's Markdown shows literally, up to invisible word joiners."""
    text = _REWRITTEN.sub(WORD_JOINER, CONTROL.sub("\ufffd", str(value)))
    text = _EDGE_SPACE.sub(_references, _ACTIVE.sub(_escape, text))
    return re.sub(r"[\r\n]", _references, text)
