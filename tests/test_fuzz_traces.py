"""Property-based tests of uploaded traces: mutations of real recorded traces of every strategy (the
golden traces: greedy, sampling, beam, speculative with each drafter, DSpark chain and tree) either load
or are refused with TraceFormatError — never another exception — and what loads renders: the Traces page
with every step on view and the What-if page, with no exception and one-line errors, within AppTest's
timeout, and with no link, image or HTML made of the trace's strings (some mutations write such strings).
Seeded (derandomize) and bounded."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from md_helpers import links, page_markdown

from decoding.core import trace
from decoding.core.trace import Trace, TraceFormatError, from_json, to_json
from ui.widgets import keys

pytestmark = pytest.mark.slow   # fuzz tests: `make test-fast` leaves them out

GOLDEN = Path(__file__).resolve().parent / "golden"
SOURCES = sorted(p for p in GOLDEN.glob("*.json") if p.name not in ("cost.json", "lockstep.json"))
TRACES = [json.loads(p.read_text(encoding="utf-8")) for p in SOURCES]
APP = str(Path(__file__).resolve().parents[1] / "app.py")

REPLACEMENTS = st.sampled_from([-1, -(10 ** 6), 10 ** 6, 2 ** 63, 0, 1, 2, 1.5, -0.5, None, "", "\ud800", "x" * 5000,
                                [], {}, [[]], [-1, 0], True, "token", "dspark", {"kind": "token"},
                                "[x](http://evil)", "![i](http://evil/i.png)", "<img src=x>"])
MUTATIONS = st.lists(st.tuples(st.integers(0, 10 ** 9), st.sampled_from(["replace", "delete", "duplicate"]),
                               REPLACEMENTS, st.booleans()), min_size=1, max_size=3)


def locations(value, where=()) -> list[tuple]:
    """Every path (keys and indices) inside a JSON value, the value's own () excluded."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append(where + (key,))
        out.extend(locations(item, where + (key,)))
    return out


def structural(value) -> set[str]:
    """Field names that hold an index, an id, a count or a list of them (and `kind`): where a wrong
    value breaks a cross-reference rather than a number on screen."""
    names = {"kind"}
    for where in locations(value):
        item = value
        for step in where:
            item = item[step]
        if isinstance(where[-1], str) and (type(item) is int or (isinstance(item, list) and item and
                                                                  all(type(x) is int for x in item))):
            names.add(where[-1])
    return names


HOT = set().union(*(structural(t) for t in TRACES))


def mutate(data: dict, mutations) -> bytes:
    """Each mutation picks a location (among the structural fields when `hot`) and replaces its value,
    deletes it, or duplicates the last entry of the list there."""
    data = copy.deepcopy(data)
    for pick, how, new, hot in mutations:
        spots = locations(data)
        hot_spots = [w for w in spots if w[-1] in HOT]
        spots = hot_spots if hot and hot_spots else spots
        *parent_path, key = spots[pick % len(spots)]
        parent = data
        for step in parent_path:
            parent = parent[step]
        if how == "delete":
            del parent[key]
        elif how == "duplicate" and isinstance(parent[key], list) and parent[key]:
            parent[key].append(copy.deepcopy(parent[key][-1]))
        else:
            parent[key] = copy.deepcopy(new)
    return json.dumps(data).encode()


def load(payload: bytes) -> Trace | None:
    """The trace, which can be written again, or None when it is refused in one line."""
    try:
        loaded = from_json(payload)
    except TraceFormatError as err:
        assert "\n" not in str(err), str(err)
        return None
    assert to_json(loaded)             # e.g. a NaN that loaded could not be saved (allow_nan=False)
    return loaded


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(TRACES) - 1), MUTATIONS)
def test_any_mutated_trace_loads_or_is_refused_in_one_line(source, mutations):
    load(mutate(TRACES[source], mutations))


def test_the_sources_cover_every_strategy_and_load():
    assert {t["strategy"] for t in TRACES} == {"greedy", "sample", "beam", "speculative", "dspark"}
    assert all(isinstance(load(json.dumps(t).encode()), Trace) for t in TRACES)


# ---------------------------------------------------------------- contradictions (issue 39)
# Each class turns a recorded trace into one whose fields are well typed but which contradicts a closed
# set, its own steps, the free-form rules or the version's form; every one is refused in one line.

CLOSED = {}
for (_cls, _field), _values in trace.CLOSED_SETS.items():
    CLOSED.setdefault(_field, set()).update(_values)
NOT_FINITE = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e301, -1e308, 2 ** 63, -(2 ** 63) - 1,
                              list(range(trace.MAX_LIST_ITEMS + 1))])
ODD_CHARS = st.sampled_from([" ", "\n", "\t", "\u00a0", "+", "-", "_", ".", ",", "\uff11", "\u0665", "\u00b2", "x"])


def _spots(data: dict, keys) -> list[tuple]:
    return [w for w in locations(data) if w[-1] in keys and w[0] not in ("config", "model")]


def _at(data, where: tuple):
    for key in where[:-1]:
        data = data[key]
    return data


def closed_value(data: dict, draw) -> None:
    where = draw(st.sampled_from(_spots(data, CLOSED)))
    _at(data, where)[where[-1]] = draw(st.text(max_size=12).filter(lambda t: t not in CLOSED[where[-1]]))


def other_output(data: dict, draw) -> None:
    out = data["output_ids"]
    if out and draw(st.booleans()):
        i = draw(st.integers(0, len(out) - 1))
        out[i] = next(t for t in data["prompt_ids"] + [0, 1] if t != out[i])
    elif out and draw(st.booleans()):
        out.pop(draw(st.integers(0, len(out) - 1)))
    else:
        out.append(data["prompt_ids"][0])


def other_count(data: dict, draw) -> None:
    name = draw(st.sampled_from(["new_tokens", "target_forwards"]))
    data["stats"][name] += draw(st.sampled_from([-1, 1])) * draw(st.integers(1, 10 ** 6))


def other_metric(data: dict, draw) -> None:
    name = draw(st.sampled_from(["mean_accepted_length", "acceptance_rate"]))
    now = data["stats"][name]
    data["stats"][name] = draw(st.floats(0, 10).filter(lambda v: now is None or abs(v - now) > 1e-6))


def other_verdict(data: dict, draw) -> None:
    """A speculative draft's verdict other than its round's numbers give, or a DSpark node accepted off
    the accepted path (a golden trace of another strategy gets a bad stop reason instead)."""
    drafts = [w for w in _spots(data, {"verdict"}) if "drafts" in w]
    nodes = [w for w in _spots(data, {"verdict"}) if "nodes" in w and _at(data, w)["verdict"] != "accepted"]
    if drafts:
        where = draw(st.sampled_from(drafts))
        now = _at(data, where)["verdict"]
        _at(data, where)["verdict"] = draw(st.sampled_from([v for v in trace.DRAFT_VERDICTS if v != now]))
    elif nodes:
        where = draw(st.sampled_from(nodes))
        _at(data, where)["verdict"] = "accepted"
    else:
        data["error"] = "an error"


def not_finite_free_form(data: dict, draw) -> None:
    spots = [w for w in locations(data) if w[0] in ("config", "model") and isinstance(_at(data, w)[w[-1]],
                                                                                      (dict, list))]
    where = draw(st.sampled_from([("config",), ("model",)] + spots))
    holder = _at(data, where + (None,))
    if isinstance(holder, list):
        holder.insert(draw(st.integers(0, len(holder))), draw(NOT_FINITE))
    else:
        holder[draw(st.text(max_size=8))] = draw(NOT_FINITE)


def odd_version(data: dict, draw) -> None:
    version = data["schema_version"]
    i = draw(st.integers(0, len(version)))
    data["schema_version"] = version[:i] + draw(ODD_CHARS) + version[i:]


CONTRADICTIONS = [closed_value, other_output, other_count, other_metric, other_verdict, not_finite_free_form,
                  odd_version]


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(TRACES) - 1), st.sampled_from(CONTRADICTIONS), st.data())
def test_every_contradiction_is_refused_in_one_line(source, contradiction, data):
    mutated = copy.deepcopy(TRACES[source])
    contradiction(mutated, data.draw)
    with pytest.raises(TraceFormatError) as err:
        from_json(json.dumps(mutated))
    assert "\n" not in str(err.value) and len(str(err.value)) < 400, str(err.value)


def open_with(payload: bytes):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("app_pages/traces.py").run()
    at.session_state[keys.REPLAY_VIEW] = "All steps"
    at.file_uploader(key=keys.UPLOAD).set_value(("t.json", payload, "application/json")).run()
    return at


def clean(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    for element in at.error:
        assert len(str(element.value).strip().splitlines()) == 1, element.value
    assert not any("could not be shown" in str(e.value) for e in at.error), [e.value for e in at.error]
    assert [text for text in page_markdown(at) if links(text)] == []      # a trace's strings show as text


@settings(max_examples=30, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(st.integers(0, len(TRACES) - 1), MUTATIONS)
def test_any_trace_that_loads_renders_on_every_page(tiny_dir, source, mutations):  # noqa: F811
    payload = mutate(TRACES[source], mutations)
    assume(load(payload) is not None)
    at = open_with(payload)
    clean(at)
    assert keys.REPLAY in at.session_state
    at.switch_page("app_pages/whatif.py").run()
    at.session_state[keys.WHATIF_SOURCE] = "Upload a trace"
    at.run()
    at.file_uploader(key=keys.WHATIF_UPLOAD).set_value(("t.json", payload, "application/json")).run()
    clean(at)
    assert keys.WHATIF_TRACE in at.session_state
