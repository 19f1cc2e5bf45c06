"""What Streamlit's Markdown would make of a string, for tests: the text a reader sees, and every live
construct in it. The parser is markdown-it-py (CommonMark, with GFM tables and strikethrough); the
constructs Streamlit adds on top are checked with their own patterns: its directives (`:red[...]`) and
`$` math in the source, and what its plugins rewrite in the parsed text (GFM's literal URLs and e-mail
addresses, emoji and `:material/...:` shortcodes, the typographic arrows)."""
from __future__ import annotations

import re

from markdown_it import MarkdownIt

from ui.views.text import WORD_JOINER

PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
PLAIN_BLOCKS = ("paragraph_open", "inline", "paragraph_close")
ESCAPED = re.compile(r"\\[!-/:-@\[-`{-~]")           # a backslash escape: the character is literal
SOURCE_PATTERNS = {"directive": re.compile(r":[A-Za-z]"), "math": re.compile(r"\$"),
                   "icon": re.compile(r":material/")}
TEXT_PATTERNS = {"url": re.compile(r"https?://|www\.", re.IGNORECASE),
                 "e-mail": re.compile(r"[-.\w+]+@[-\w]+(?:\.[-\w]+)+"),
                 "shortcode": re.compile(r":[\w+-]+:"),
                 "arrow": re.compile(r"(?:^|\s)(?:<->|->|<-|--|>=|<=|~=)(?:\s|$)")}


def _inline(source: str) -> tuple[list[str], list]:
    """The block token types other than one plain paragraph, and the paragraph's inline children."""
    tokens = PARSER.parse(source)
    blocks = [t.type for t in tokens if t.type not in PLAIN_BLOCKS]
    children = [c for t in tokens if t.type == "inline" for c in t.children or ()]
    return blocks, children


def shown(source: str) -> str:
    """The text a reader sees (word joiners dropped)."""
    return "".join(c.content for c in _inline(source)[1]).replace(WORD_JOINER, "")


def live(source: str) -> list[str]:
    """Every construct in `source` that would render as more than plain text; [] when it shows literally."""
    blocks, children = _inline(source)
    found = blocks + [c.type for c in children if c.type != "text"]
    bare = ESCAPED.sub("", source)
    found += [name for name, pattern in SOURCE_PATTERNS.items() if pattern.search(bare)]
    text = "".join(c.content for c in children if c.type == "text")
    return found + [name for name, pattern in TEXT_PATTERNS.items() if pattern.search(text)]


LINKING = {"link_open", "image", "html_inline", "html_block", "url", "e-mail"}
MARKDOWN_KINDS = ("markdown", "caption", "title", "header", "subheader", "error", "warning", "info", "success",
                  "metric", "expander", "tab", "button", "download_button", "file_uploader", "selectbox", "slider",
                  "number_input", "radio", "button_group", "checkbox", "toggle", "text_input", "text_area",
                  "multiselect")


def links(source: str) -> list[str]:
    """The constructs in `source` that would put a link, an image or HTML on the page."""
    return [found for found in live(source) if found in LINKING]


def page_markdown(at) -> list[str]:
    """Every string an AppTest page hands to Streamlit's Markdown: bodies, labels, metric values and
    deltas, help texts (st.text, st.code and st.html are not Markdown and are left out)."""
    texts = []
    for kind in MARKDOWN_KINDS:
        for element in at.get(kind):
            proto = getattr(element, "proto", None)
            for field in ("body", "label", "delta", "help"):
                value = getattr(proto, field, None)
                texts += [value] if isinstance(value, str) and value else []
            label = getattr(element, "label", None)
            texts += [label] if isinstance(label, str) and label else []
    return texts
