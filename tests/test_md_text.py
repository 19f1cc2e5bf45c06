"""One rule for text from a trace, a link or an upload where Streamlit reads Markdown: it goes through
ui.views.text.md_text. A property test shows that md_text(s) renders as exactly s and nothing live (no
link, image, HTML, formatting, block, directive, math, shortcode or autolink); a static check holds every
Markdown-reading Streamlit call in app.py, app_pages/ and ui/ to the rule; an uploaded trace whose strings
are links, images and HTML renders none of them. Each check has a negative control."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from md_helpers import links, live, page_markdown, shown

from ui.views.text import CONTROL, WORD_JOINER, md_text

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["[x](http://evil)", "![i](http://evil/i.png)", "<img src=x>", "<script>alert(1)</script>", "**b**",
           "_i_", "`c`", "~~s~~", "$x^2$", ":red[r]", ":smile:", ":material/home:", ":streamlit:", "# h", "- l",
           "1. l", "2) l", "> q", "---", "| a | b |\n|---|---|", "    code", "```\nfence\n```", "a  \nb", "x\n\n# y",
           "http://evil.com", "https://evil", "www.evil.com", "WWW.Evil.com", "me@evil.com", "a -> b", "a <-> b",
           "&amp;", "&#x3C;", "\\[", "\\", "[r]: http://evil", "[^1]", "a_b_c", "__init__", " lead", "trail \t",
           "\x00", "\r\n", "1\u2028x", "\u00a0nbsp\u00a0"]
PIECES = st.sampled_from(list("\\`*_{}[]()#+-.!|<>~$&:@='\" \n\r\t\x00aw1é") + HOSTILE)
TEXTS = st.one_of(st.text(), st.lists(PIECES, max_size=12).map("".join))


def literal(s: str) -> str:
    return CONTROL.sub("\ufffd", s).replace(WORD_JOINER, "")


@pytest.mark.parametrize("s", HOSTILE)
def test_hostile_strings_show_literally(s):
    assert live(md_text(s)) == [] and shown(md_text(s)) == literal(s)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(TEXTS)
def test_any_text_shows_literally(s):
    source = md_text(s)
    assert live(source) == [], (s, source)
    assert shown(source) == literal(s), (s, source)


@pytest.mark.parametrize("s", ["[x](http://evil)", "![i](http://evil/i.png)", "<img src=x>", "**b**", "# h",
                               ":red[r]", "$x$", "http://evil.com", "me@evil.com", ":smile:", "a -> b"])
def test_the_checks_see_raw_markdown(s):
    """Negative control: each construct, unescaped, is seen as live."""
    assert live(s)


def test_non_strings_are_shown_as_their_text():
    assert shown(md_text(3.5)) == "3.5" and shown(md_text(None)) == "None"


# ---------------------------------------------------------------- the static check

# Streamlit calls that read Markdown (1.67): their label, body, help and text; a metric's value and delta; the
# options and captions of radio, pills and segmented_control (other widgets' options are plain text).
MARKDOWN_CALLS = {"markdown", "caption", "write", "info", "warning", "error", "success", "toast", "title", "header",
                  "subheader", "metric", "expander", "popover", "tabs", "status", "spinner", "progress", "button",
                  "download_button", "link_button", "page_link", "form_submit_button", "checkbox", "toggle", "radio",
                  "selectbox", "multiselect", "select_slider", "slider", "number_input", "text_input", "text_area",
                  "date_input", "time_input", "file_uploader", "segmented_control", "pills", "table", "badge"}
TEXT_KEYWORDS = {"body", "label", "help", "text"}
MORE_TEXT = {"metric": ((0, 1, 2), {"value", "delta"}), "progress": ((1,), set()),
             **{name: ((0, 1), {"options", "captions"}) for name in ("radio", "pills", "segmented_control")}}
ESCAPERS = {"md_text"}
# Markdown written in this repository that inserts only numbers: the tour's text, titles and stop ids
# (ui/views/tour.py), the Lab's findings (ui/views/lab.py, memory.py) and the what-if's cost note (ui/views/whatif.py).
AUTHORED = {"stop.body", "stop.terms", "stop.look_for", "stop.id", "stop.title", "tour.stop_label", "lab.regime",
            "lab.tradeoff", "memory.memory_summary", "whatif.cost_note",
            "made_with.label",                                # a parameter's words (made_with.param_words)
            "waiting_line"}                                   # authored text around a count (waiting.waiting_line)
NUMERIC = {"len", "int", "float", "round", "abs", "sum"}         # return a number, whatever they are given
NUMBER_FORMATS = tuple("dfFeEgGn%xXbo")                        # a format spec of these refuses a string


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _constant(node: ast.expr) -> bool:
    """A module constant (UPPER_CASE), an item of one, or one looked up with .get: text written here."""
    if isinstance(node, ast.Subscript):
        return _constant(node.value)
    if isinstance(node, ast.Call) and _name(node.func) == "get":
        return _constant(node.func.value)
    return isinstance(node, (ast.Name, ast.Attribute)) and _name(node).isupper()


class Scope:
    """The assignments of one function (or module): a local variable is as safe as every value given it."""

    def __init__(self, body: ast.AST):
        self.values: dict[str, list[ast.expr]] = {}
        for node in ast.walk(body):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None else []
            for target in targets:
                pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(
                    node.value, ast.Tuple) and len(target.elts) == len(node.value.elts) else [(target, node.value)]
                for name, value in pairs:
                    if isinstance(name, ast.Name):
                        self.values.setdefault(name.id, []).append(value)
        self.seen: set[str] = set()

    def variable(self, name: str, check) -> bool:
        if name not in self.values or name in self.seen:
            return False
        self.seen.add(name)
        try:
            return all(check(v) for v in self.values[name])
        finally:
            self.seen.discard(name)

    def part(self, node: ast.expr) -> bool:
        """A value inserted into text: escaped, a number, a constant, or built only of such."""
        if isinstance(node, ast.Constant) or _constant(node) or ast.unparse(node) in AUTHORED:
            return True
        if isinstance(node, ast.FormattedValue):
            spec = "".join(v.value for v in getattr(node.format_spec, "values", ()) if isinstance(v, ast.Constant))
            return (spec.endswith(NUMBER_FORMATS) and node.conversion == -1) or self.part(node.value)
        if isinstance(node, ast.Name):
            return self.variable(node.id, self.part)
        if isinstance(node, ast.Call):
            return _name(node.func) in ESCAPERS | NUMERIC or ast.unparse(node.func) in AUTHORED or (
                _name(node.func) in ("max", "min") and all(self.part(a) for a in node.args))
        if isinstance(node, ast.BinOp):
            return isinstance(node.op, (ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)) or self.text(node)
        if isinstance(node, ast.IfExp):
            return self.part(node.body) and self.part(node.orelse)
        return isinstance(node, (ast.JoinedStr, ast.List, ast.Tuple)) and self.text(node)

    def text(self, node: ast.expr) -> bool:
        """Text handed to Markdown: a literal, escaped, a constant, or assembled (f-string, +, .format, str(),
        join) only of such and of numbers; an attribute is text of unknown origin unless it is authored."""
        if isinstance(node, ast.Attribute):
            return ast.unparse(node) in AUTHORED or _constant(node) or (node.attr == "get" and _constant(node.value))
        if isinstance(node, ast.Name):
            return node.id in ESCAPERS or _constant(node) or self.variable(node.id, self.text)
        if isinstance(node, ast.JoinedStr):
            return all(self.part(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return self.part(node.left) and self.part(node.right)
        if isinstance(node, ast.IfExp):
            return self.text(node.body) and self.text(node.orelse)
        if isinstance(node, (ast.List, ast.Tuple)):
            return all(self.text(e) for e in node.elts)
        if isinstance(node, ast.Call) and _name(node.func) == "list" and node.args:
            return _constant(node.args[0])
        return self.part(node)


def _modules(tree: ast.Module) -> set[str]:
    """Names a file imports other than streamlit's `st`: calls on them (display.table) are the project's own."""
    names = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    return names - {"st"}


def _texts(node: ast.AST, own: set[str]) -> list[ast.expr] | None:
    """The text arguments of a Markdown-reading Streamlit call; None for any other node. A call on anything
    but an imported module (st, a column, a container) counts as Streamlit's."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MARKDOWN_CALLS
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in own)):
        return None
    positions, keywords = MORE_TEXT.get(node.func.attr, ((0,), set()))
    texts = [a for i, a in enumerate(node.args) if i in positions] + [
        k.value for k in node.keywords if k.arg in TEXT_KEYWORDS | keywords]
    shown_by = [k.value for k in node.keywords if k.arg == "format_func"]   # options are shown through it
    if shown_by and ("options" in keywords):
        texts = [t for t in texts if t is not (node.args[1] if len(node.args) > 1 else None)] + shown_by
    return texts


def unescaped(source: str, filename: str = "<snippet>") -> list[str]:
    """'file:line call(...)' for each Markdown-reading call whose text is not held to the rule. Variables
    are followed within their function (parameters and loop variables are of unknown origin)."""
    tree = ast.parse(source)
    own = _modules(tree)
    found = []

    def visit(node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            inner = Scope(child) if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
            texts = _texts(child, own)
            if texts is not None and not all(inner.text(t) for t in texts):
                found.append(f"{filename}:{child.lineno} {child.func.attr}(...)")
            visit(child, inner)

    visit(tree, Scope(tree))
    return found


def page_sources() -> list[Path]:
    return [ROOT / "app.py", *sorted((ROOT / "app_pages").glob("*.py")), *sorted((ROOT / "ui").rglob("*.py"))]


def test_every_markdown_call_escapes_what_it_inserts():
    found = [hit for path in page_sources()
             for hit in unescaped(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("snippet", [
    'st.caption(f"Verify costs from {info.cost_source}")',
    'st.error(f"{upload.name} is not a readable trace: {err}")',
    'cols[0].metric("Selection", str(event.select))',
    'st.markdown("**" + label + "**")',
    'st.warning("model {}".format(name))',
    'st.expander(f"Prompt {prompt!r:.20}")',
    'st.error(", ".join(names))',
    'st.info(f"{x:>10}")',
    'cols[2].metric("Final token", event.final_kind)',
    'c.metric("Rank", step.rank, help=tip)',
    'st.expander(label)',
])
def test_the_static_check_sees_raw_interpolation(snippet):
    """Negative control: raw interpolation is flagged; the same text escaped, or a number, is not."""
    assert unescaped(snippet)


@pytest.mark.parametrize("snippet", [
    'st.caption(f"Verify costs from {md_text(info.cost_source)}")',
    'st.error(f"{len(x)} steps, {m[\'tau\']:.2f}, {n - 1}, {step.index:d}")',
    'st.markdown("**" + md_text(label) + "**")',
    'cols[0].metric("Selection", md_text(event.select), help="x")',
    'st.radio("Colour", OPTIONS, format_func=LABELS.get, key=k)',
    'st.markdown(stop.body)',
])
def test_the_static_check_passes_escaped_text(snippet):
    assert unescaped(snippet) == []


# ---------------------------------------------------------------- hostile uploads, end to end

GOLDEN = ROOT / "tests" / "golden"
LINK, IMAGE, TAG = "[x](http://evil)", "![i](http://evil/i.png)", "<img src=x>"
EVIL = f"{LINK} {IMAGE} {TAG}"


def _hostile(name: str, fields: dict[str, tuple[str, ...]]) -> bytes:
    """A golden trace with EVIL in the model name and in the given fields of every step (a tuple: a path)."""
    data = json.loads((GOLDEN / name).read_text(encoding="utf-8"))
    data["model"]["name"] = EVIL
    for step in data["steps"]:
        for path in fields.values():
            holder = step
            for key in path[:-1]:
                holder = holder.get(key) or {}
            if path[-1] in holder:
                holder[path[-1]] = EVIL
    return json.dumps(data).encode()


def _upload(payload: bytes, filename: str = "t.json", cursor: int | None = None):
    """The Traces page after uploading `payload` (and moving to step `cursor`)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.switch_page("app_pages/traces.py").run()
    at.file_uploader(key="tr.upload").set_value((filename, payload, "application/json")).run()
    if cursor is not None:
        at.slider(key="ds.replay_cursor").set_value(cursor).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_check_sees_a_raw_link():
    """Negative control of the checks below: the hostile strings, raw, are links, an image and HTML."""
    assert "link_open" in links(LINK) and "image" in links(IMAGE) and "html_block" in links(TAG)
    assert "html_inline" in links(f"a {TAG}")
    assert links("see http://evil") == ["url"]


@pytest.mark.parametrize("name, fields, in_markdown", [
    # a speculative round: the cost-aware γ's drafter (a caption); its cost table's file name and the round's
    # drafter are st.text
    ("spec_cost.json", {"drafter": ("drafter",), "cost": ("gamma_choice", "cost_source"),
                        "source": ("gamma_choice", "source")}, 1),
    # a DSpark round: the cost table's name is st.text, so no Markdown holds it
    ("dspark_tree_cost.json", {"cost": ("size", "cost_source")}, 0),
])
@pytest.mark.slow
def test_an_uploaded_trace_shows_its_strings_and_no_link(tiny_dir, name, fields, in_markdown):  # noqa: F811
    at = _upload(_hostile(name, fields), cursor=1)
    texts = page_markdown(at)
    assert not at.error, [e.value for e in at.error]
    assert [t for t in texts if links(t)] == []
    assert sum(EVIL in shown(t) for t in texts) == in_markdown       # shown, as the characters it holds


@pytest.mark.parametrize("name, field", [("spec_cost.json", ("final_kind",)),
                                         ("dspark_tree_cost.json", ("next_from",))])
def test_a_hostile_value_in_a_closed_set_is_refused_as_text(tiny_dir, name, field):  # noqa: F811
    """Fields of a closed set (the final token's kind, where DSpark's next token came from) used to reach a
    metric; the loader now refuses any other value, and its refusal shows the value as text."""
    at = _upload(_hostile(name, {"f": field}))
    (error,) = at.error
    assert links(error.value) == []
    assert field[-1] in shown(error.value) and LINK in shown(error.value)


def test_the_refusal_of_an_upload_shows_the_bad_value_and_no_link(tiny_dir):  # noqa: F811
    payload = json.dumps({"schema_version": LINK, "steps": []}).encode()
    at = _upload(payload, filename=f"{IMAGE}.json")
    (error,) = at.error
    assert links(error.value) == []
    assert f"{IMAGE}.json is not a readable trace" in shown(error.value) and LINK in shown(error.value)
