"""Every table the app shows speaks to its users (issue 39): headers in words, never a trace's field name;
"—" where a value does not apply, never "None"; no server path; tiny probabilities keep their digits. The
pages are driven through AppTest on recorded traces (tests/golden, no model); the Lab's measured tables,
which need a model to fill, are checked on hand-made measurements through the same headers.shown."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from page_support import app, golden, report, results, rich_step  # noqa: F401  (app: fixture)

from ui.views import headers, lab, lossless
from ui.widgets import keys

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
GOLDEN = ROOT / "tests" / "golden"
FIELD_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")     # token_id, speedup_vs_greedy, ...
NULL_TEXT = {"None", "nan", "NaN", "<NA>", "NaT", "null"}
SERVER_PATH = re.compile(r"(^|[\s(])(/[\w.-]+){2,}")
REPLAYED = ("greedy", "sample", "beam", "spec_lookup", "spec_lookup_sampled", "spec_cost", "dspark_chain",
            "dspark_lookup_cost", "dspark_tree_sampled")


def header_problems(frame: pd.DataFrame) -> list[str]:
    return [f"header {c!r} is a field name" for c in frame.columns if FIELD_NAME.match(str(c))]


def cell_problems(frame: pd.DataFrame) -> list[str]:
    texts = [v for c in frame.columns for v in frame[c] if isinstance(v, str)]
    names = [v for c in ("verdict", "status") if c in frame.columns for v in frame[c] if isinstance(v, str)]
    return ([f"cell {v!r}" for v in texts if v.strip() in NULL_TEXT or SERVER_PATH.search(v)]
            + [f"cell {v!r} is a name" for v in names if FIELD_NAME.match(v)])


def tiny_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if frame[c].dtype.kind == "f"
            and ((frame[c] != 0) & (frame[c].abs() < headers.SMALL)).any()]


def shown_problems(element) -> list[str]:
    """What is wrong with one st.dataframe as the browser draws it: its frame, its text for missing values
    and its column formats."""
    frame = element.value
    out = header_problems(frame) + cell_problems(frame)
    if element.proto.placeholder != headers.NOT_APPLICABLE:
        out.append(f"missing values drawn as {element.proto.placeholder or 'None'!r}")
    config = json.loads(element.proto.columns or "{}")
    out += [f"column {c!r} holds values below {headers.SMALL} with Streamlit's default format"
            for c in tiny_columns(frame) if headers.SMALL_FORMAT not in json.dumps(config.get(c, {}))]
    return out


def collect(at, where: str, seen: dict) -> None:
    """Each table on the page -> what is wrong with it; the tables with tiny values under the key "tiny"."""
    assert not at.exception, [e.value for e in at.exception]
    for element in at.dataframe:
        seen[f"{where}: {list(element.value.columns)}"] = shown_problems(element)
        seen.setdefault("tiny", []).extend(tiny_columns(element.value))


def with_an_unlikely_draft(trace):
    """The trace with its richest round's first draft at p_target 3.4e-05 (a draft the target found unlikely)."""
    i = rich_step(trace.steps)
    event = trace.steps[i]
    first = replace(event.drafts[0], p_target=3.4e-05, ratio=3.4e-05, accept_prob=3.4e-05)
    steps = list(trace.steps)
    steps[i] = replace(event, drafts=(first, *event.drafts[1:]))
    return replace(trace, steps=type(trace.steps)(steps))


@pytest.mark.slow
def test_every_table_on_the_pages_speaks_to_users(app):
    seen: dict[str, list[str]] = {}
    at = app()
    at.switch_page("app_pages/traces.py")
    for name in (*REPLAYED, "unlikely"):
        trace = with_an_unlikely_draft(golden("spec_lookup_sampled")) if name == "unlikely" else golden(name)
        at.session_state[keys.REPLAY] = trace
        at.session_state[keys.REPLAY_CURSOR] = rich_step(trace.steps)
        at.session_state["tr.cands_open"] = True                  # the candidates table's lazy expander
        at.session_state[keys.REPLAY_VIEW] = "This step"
        collect(at.run(), f"{name} step", seen)
        at.session_state[keys.REPLAY_VIEW] = "All steps"
        collect(at.run(), f"{name} all steps", seen)
    at.session_state[keys.REPLAY] = golden("spec_lookup")          # the Lab reads the replayed trace
    collect(at.switch_page("app_pages/lab.py").run(), "lab", seen)
    at.session_state[keys.WHATIF_SOURCE] = "Upload a trace"
    for name in ("spec_cost", "dspark_chain"):
        at.session_state[keys.WHATIF_TRACE] = golden(name)
        collect(at.switch_page("app_pages/whatif.py").run(), f"what-if {name}", seen)
    at.session_state[keys.COMPARE] = {f"{i + 1}: {n}": golden(n) for i, n in enumerate(
        ("greedy", "spec_lookup", "dspark_chain", "beam"))}
    collect(at.switch_page("app_pages/compare.py").run(), "compare", seen)
    assert len(seen) >= 30, list(seen)                             # the drive reached the tables
    tiny = set(seen.pop("tiny"))
    assert {where: p for where, p in seen.items() if p} == {}
    assert {"p target", "acceptance probability", "Σmin(p,q)"} <= tiny   # the format check had tiny values
    beam_headers = {h for where in seen if where.startswith("beam") for h in re.findall(r"'([^']*)'", where)}
    assert "score (sum of log p)" in beam_headers and "ŝ" not in beam_headers   # beam's score is not DSpark's


def test_compare_shows_a_greedy_lanes_tau_as_not_applicable(app):
    at = app()
    at.session_state[keys.COMPARE] = {"1: greedy": golden("greedy"), "2: speculative": golden("spec_lookup")}
    at.switch_page("app_pages/compare.py").run()
    metrics = at.dataframe[0]
    tau = metrics.value.set_index("lane")[headers.HEADERS["tau"]]
    assert pd.isna(tau["1: greedy"]) and tau["2: speculative"] > 1
    assert metrics.proto.placeholder == "—"
    assert "speed vs greedy (×)" in metrics.value.columns


def test_the_labs_measured_tables_speak_to_users():
    measured = report({1: 100.0, 2: 104.0, 4: 110.0, 9: 160.0}, {1: 100.0, 4: 130.0})
    tables = [lab.rounded(lab.cost_table(measured)), lab.rounded(lab.speculation_table(measured)),
              lab.device_table(measured), lab.rounded(lab.throughput_table(results())), lossless.worked_example()]
    for table in tables:
        view = headers.shown(table)
        assert header_problems(view) + cell_problems(view) == [], list(table.columns)


def test_the_checks_catch_a_field_name_a_none_cell_and_a_default_format():
    """Negative control: what the page tests above would report on the tables as they were."""
    raw = pd.DataFrame({"token_id": [5], "q_draft": [None], "p_target": [3.4e-05], "note": ["None"]})
    assert header_problems(raw) == ["header 'token_id' is a field name", "header 'q_draft' is a field name",
                                    "header 'p_target' is a field name"]
    assert cell_problems(raw) == ["cell 'None'"]
    assert cell_problems(pd.DataFrame({"verdict": ["not_reached"]})) == ["cell 'not_reached' is a name"]
    assert cell_problems(headers.shown(pd.DataFrame({"verdict": ["not_reached"], "status": ["eos_not_top"]}))) == []
    assert cell_problems(pd.DataFrame({"source": ["/home/user/cache/cost/x.json"]})) != []
    assert tiny_columns(raw) == ["p_target"]
    view = headers.shown(raw)
    assert header_problems(view) == [] and list(view.columns[:3]) == ["token id", "q draft", "p target"]
    assert headers.shown(pd.DataFrame({"not_a_field": [1]})).columns.tolist() == ["not_a_field"]   # caught above


def test_shown_keeps_whole_numbers_whole_and_formats_tiny_values():
    raw = pd.DataFrame({"token_id": [5.0, None], "p_target": [3.4e-05, 0.5], "ms": [1.5, 2.0]})
    view = headers.shown(raw, {"ms": "round (ms)"})
    assert str(view["token id"].dtype) == "Int64" and view["token id"].isna().tolist() == [False, True]
    assert list(view.columns) == ["token id", "p target", "round (ms)"]
    assert headers.number_formats(view) == {"p target": "%.4g"}
    rates = headers.shown(pd.DataFrame({"acceptance_rate": [0.4, None], "expected_acceptance_rate": [0.5, 0.25],
                                        "tokens_per_forward": [1.7, 1.2]}))
    assert headers.number_formats(rates) == {"acceptance rate": "percent", "expected acceptance rate": "percent"}
