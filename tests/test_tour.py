"""The guided tour: its stops, the traces shipped in assets/tour/, the recorder (bench/tour.py), and the page (AppTest),
which shows every stop from the recordings without loading a model."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from app_support import assert_same, no_model, tour_app  # noqa: F401  (no_model: fixture)

from bench import tour as recorder
from decoding.core.trace import TraceFormatError, from_json, to_json, without_timings
from decoding.runtime.paths import PARALLEL_WEIGHTS
from ui.views import tour
from ui.widgets import keys

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 120


def recorded_stops():
    return [s for s in tour.STOPS if tour.trace_path(s).is_file()]


# ---------------------------------------------------------------- stops and shipped traces

def test_stops_have_unique_ids_and_valid_configs():
    ids = tour.stop_ids()
    assert len(ids) == len(set(ids)) == 7
    for stop in tour.STOPS:
        assert stop.config().strategy == stop.strategy
        assert stop.config().max_new_tokens <= 40
    assert tour.neighbour(ids[0], -1) == ids[0] and tour.neighbour(ids[-1], 1) == ids[-1]
    assert tour.neighbour(ids[2], 1) == ids[3] and tour.neighbour(ids[2], -1) == ids[1]
    line = tour.config_line(tour.stop_by_id("adaptive"))
    assert line.startswith("speculative with draft lookup, gamma 2, gamma policy heuristic;")
    assert "max new tokens 40, seed 0, top-N candidates recorded 5" in line


def test_a_stops_settings_are_in_the_sidebars_words():
    """Issue 46: the Tour's "Settings:" line names each parameter as the sidebar's widget does (no raw
    field names such as max_new_tokens=…)."""
    from ui.views import made_with
    from ui.widgets.params import param_fields

    for stop in tour.STOPS:
        line = tour.config_line(stop)
        assert "_" not in line and "=" not in line, line
        for name, _ in stop.params:
            field = next(f for f in param_fields(stop.strategy) if f.name == name)   # a sidebar widget's field
            assert made_with.param_words(field.name) in line
    assert made_with.label("top_n") == "Top-N candidates recorded" and made_with.label("seed") == "Seed"


def test_unknown_stop_is_a_config_error():
    with pytest.raises(ValueError, match="stop='nope' is invalid"):
        tour.stop_by_id("nope")


def test_every_stop_is_recorded_except_dspark_until_its_weights_exist():
    missing = {s.id for s in tour.STOPS} - {s.id for s in recorded_stops()}
    assert missing <= (set() if PARALLEL_WEIGHTS.is_file() else {"dspark"})


@pytest.mark.parametrize("stop", recorded_stops(), ids=lambda s: s.id)
def test_shipped_trace_loads_is_small_and_matches_its_stop(stop):
    raw = tour.trace_path(stop).read_bytes()
    assert len(raw) <= tour.MAX_SHIPPED_BYTES
    trace = from_json(raw)
    assert trace.strategy == stop.strategy and trace.error is None
    assert trace.model["name"] == tour.MODEL
    assert tour.stale_fields(stop, trace) == []
    assert trace.stats.new_tokens == len(trace.output_ids) > 0
    assert 0 <= tour.focus_step(stop, trace.steps) < len(trace.steps)


def test_stale_fields_name_what_changed():
    stop = tour.stop_by_id("greedy")
    trace = tour.load_recorded(stop)
    assert tour.stale_fields(dataclasses.replace(stop, top_n=3), trace) == ["top_n"]
    assert tour.stale_fields(dataclasses.replace(stop, prompt="Other."), trace) == ["prompt"]


def test_speculative_stops_speed_up_and_agree_with_each_other():
    """The story's claims, checked on the recordings: lookup drafting emits more than one token per
    target forward, and fixed and adaptive γ give the same (exact) answer."""
    spec = tour.load_recorded(tour.stop_by_id("speculative"))
    adaptive = tour.load_recorded(tour.stop_by_id("adaptive"))
    serial = tour.load_recorded(tour.stop_by_id("serial"))
    assert spec.stats.new_tokens / spec.stats.target_forwards > 1.5
    assert serial.stats.new_tokens == serial.stats.target_forwards
    assert spec.output_ids == adaptive.output_ids
    assert len({e.gamma for e in adaptive.steps if hasattr(e, "gamma")}) > 2


def test_dspark_stop_numbers_match_its_recording():
    """The DSpark stop quotes its recording: 26 tokens in 9 target forwards (2.9 per forward), with
    nodes from prompt lookup among the accepted ones; re-recording with other settings must update
    the prose."""
    stop = tour.stop_by_id("dspark")
    trace = tour.load_recorded(stop)
    assert (trace.stats.new_tokens, trace.stats.target_forwards) == (26, 9)
    assert f"{trace.stats.new_tokens / trace.stats.target_forwards:.1f} per forward" in stop.body
    assert "26 tokens take 9 target forwards" in stop.body
    assert any(n.lookup and n.verdict == "accepted" for e in trace.steps for n in e.nodes)


def test_load_recorded_missing_and_malformed(tmp_path):
    stop = tour.stop_by_id("greedy")
    assert tour.load_recorded(stop, tmp_path) is None
    tour.trace_path(stop, tmp_path).write_text('{"schema_version": "1.0"}')
    with pytest.raises(TraceFormatError):
        tour.load_recorded(stop, tmp_path)


def _steps(**fields):
    keys_ = list(fields)
    return [SimpleNamespace(**dict(zip(keys_, values))) for values in zip(*fields.values())]


def test_focus_step_rules():
    c = lambda p1, p2: (SimpleNamespace(prob=p1), SimpleNamespace(prob=p2))  # noqa: E731
    greedy = _steps(raw_top=[c(0.9, 0.05), c(0.4, 0.35), c(0.6, 0.3)])
    assert tour.focus_step(tour.stop_by_id("greedy"), greedy) == 1
    cut = lambda *m: tuple(SimpleNamespace(name=n, removed_mass=x) for n, x in m)  # noqa: E731
    sampling = _steps(filters=[cut(("temperature", 0.9), ("top_k", 0.1)), cut(("top_p", 0.3)), cut(("min_p", 0.2))])
    assert tour.focus_step(tour.stop_by_id("sampling"), sampling) == 1     # temperature's mass is not a cut
    spec = [SimpleNamespace(emitted=(0,) * n, gamma=g) for n, g in [(1, 5), (4, 2), (4, 7)]]
    assert tour.focus_step(tour.stop_by_id("speculative"), spec) == 1      # first of the ties
    assert tour.focus_step(tour.stop_by_id("adaptive"), spec) == 2
    assert tour.focus_step(tour.stop_by_id("beam"), spec) == 2
    assert tour.focus_step(tour.stop_by_id("serial"), spec) == 0
    assert tour.focus_step(tour.stop_by_id("greedy"), []) == 0


# ---------------------------------------------------------------- the recorder

@pytest.fixture(scope="module")
def tour_model_dir(tmp_path_factory):
    """The tiny app model's folder, for the tests that hand it to the recorder or the page themselves (unlike
    conftest's `tiny_dir`, it leaves DECODESCOPE_MODEL alone)."""
    from bench.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_tour_model"))


def test_record_unknown_stop_exits_2_without_loading(monkeypatch, capsys):
    import decoding.runtime.models

    monkeypatch.setattr(decoding.runtime.models, "load", lambda spec: pytest.fail("no model for a bad --only"))
    assert recorder.main(["record", "--only", "nope"]) == 2
    assert "stop='nope' is invalid" in capsys.readouterr().err


def test_record_to_a_folder_name_over_the_limit_exits_2_without_loading(tmp_path, monkeypatch, capsys):
    import decoding.runtime.models

    monkeypatch.setattr(decoding.runtime.models, "load", lambda spec: pytest.fail("no model for a bad --out"))
    assert recorder.main(["record", "--only", "greedy", "--out", str(tmp_path / ("x" * 300))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out=") and "is 300 bytes long; the limit here is" in err and err.count("\n") == 1


@pytest.mark.slow
def test_record_writes_only_the_named_stop_and_skips_a_failed_run(tour_model_dir, tmp_path, monkeypatch, capsys):
    import decoding.runtime.models

    real_load = decoding.runtime.models.load
    specs = []
    tiny = str(tour_model_dir)
    monkeypatch.setattr(decoding.runtime.models, "load",
                        lambda spec: specs.append(spec) or real_load(dataclasses.replace(spec, name=tiny)))
    # "auto" taken for the shipped feature head, which refuses the tiny model: the dspark stop fails
    monkeypatch.setattr("decoding.drafters.factory.shipped_fits", lambda lm: True)
    assert recorder.main(["record", "--only", "greedy", "--only", "dspark", "--out", str(tmp_path)]) == 1
    assert [s.name for s in specs] == ["default"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["greedy.json"]
    trace = from_json((tmp_path / "greedy.json").read_bytes())
    assert tour.stale_fields(tour.stop_by_id("greedy"), trace) == []
    assert "dspark: not recorded" in capsys.readouterr().out


# ---------------------------------------------------------------- the page

def ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]


def has_chips(at) -> bool:
    return any("ds-origin-" in h.value and "data-step=" in h.value for h in at.html)


@pytest.mark.slow
def test_tour_walks_every_stop_from_the_recordings_without_a_model(no_model):
    at = tour_app()
    ok(at)
    recorded = {s.id for s in recorded_stops()}
    for i, stop in enumerate(tour.STOPS):
        assert at.session_state[keys.TOUR_STOP] == stop.id
        assert [h.value for h in at.main.header] == [f"{i + 1}. {stop.title}"]
        assert at.selectbox(key=keys.TOUR_SELECT).value == stop.id
        assert at.button(key=keys.TOUR_PREV).disabled == (i == 0)
        assert at.button(key=keys.TOUR_NEXT).disabled == (i == len(tour.STOPS) - 1)
        assert has_chips(at) == (stop.id in recorded)
        assert any("not recorded yet" in x.value for x in at.info) == (stop.id not in recorded)
        assert not at.error and not at.warning
        assert not any("No panel for step kind" in x.value for x in at.info)   # a registered panel drew it
        if i < len(tour.STOPS) - 1:
            at.button(key=keys.TOUR_NEXT).click().run()
            ok(at)
    assert no_model == []


def test_no_model_fixture_bites_when_the_page_loads_a_model(no_model):
    """Negative control for the tests above: a live re-run does load a model, and the fixture sees it."""
    at = tour_app({"stop": "greedy"})
    assert no_model == []
    at.button(key=keys.TOUR_RUN).click().run()
    assert len(no_model) == 1        # and the page failed: the guard's line (ui/widgets/guard.py) says so
    assert any("could not be shown (AssertionError)" in e.value for e in at.error), [e.value for e in at.error]


def test_link_opens_a_stop_and_selector_and_previous_move(no_model):
    at = tour_app({"stop": "beam"})
    ok(at)
    assert at.main.header[0].value == "3. Beam search"
    assert at.query_params["stop"] == "beam"
    trees = at.get("graphviz_chart")                  # the beam panel drew its tree from the recording
    assert len(trees) == 1 and "Paris" in trees[0].proto.spec
    at.selectbox(key=keys.TOUR_SELECT).set_value("adaptive").run()
    ok(at)
    assert at.main.header[0].value.endswith("Adaptive γ") and at.query_params["stop"] == "adaptive"
    at.button(key=keys.TOUR_PREV).click().run()
    assert at.session_state[keys.TOUR_STOP] == "dspark"
    assert at.selectbox(key=keys.TOUR_SELECT).value == "dspark"
    assert no_model == []


def test_unknown_stop_in_the_link_warns_and_opens_the_first(no_model):
    at = tour_app({"stop": "<b>nope</b>"})
    ok(at)
    assert at.session_state[keys.TOUR_STOP] == tour.STOPS[0].id
    assert any("not a tour stop" in w.value for w in at.warning)


def test_missing_trace_shows_the_placeholder(no_model, monkeypatch, tmp_path):
    shipped = tour.trace_path(tour.stop_by_id("greedy")).read_bytes()
    monkeypatch.setattr(tour, "TOUR_DIR", tmp_path)
    at = tour_app({"stop": "greedy"})
    ok(at)
    assert any("not recorded yet" in x.value and "--only greedy" in x.value for x in at.info)
    assert not has_chips(at) and not at.slider
    # negative control: with the trace in place the same page draws it
    tour.trace_path(tour.stop_by_id("greedy"), tmp_path).write_bytes(shipped)
    at = tour_app({"stop": "greedy"})
    assert has_chips(at) and at.slider and not any("not recorded yet" in x.value for x in at.info)


def test_unreadable_trace_shows_an_error(no_model, monkeypatch, tmp_path):
    monkeypatch.setattr(tour, "TOUR_DIR", tmp_path)
    tour.trace_path(tour.stop_by_id("greedy"), tmp_path).write_text("{not json")
    at = tour_app({"stop": "greedy"})
    ok(at)
    assert any("cannot be read" in e.value for e in at.error)


@pytest.mark.slow
def test_live_rerun_uses_the_stops_config(tour_model_dir, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_MODEL", str(tour_model_dir))
    at = tour_app({"stop": "greedy"})
    at.button(key=keys.TOUR_RUN).click().run()
    ok(at)
    live = at.session_state[keys.TOUR_LIVE]["greedy"]
    recorded = tour.load_recorded(tour.stop_by_id("greedy"))
    assert live.model["name"] == str(tour_model_dir)
    assert live.prompt_ids == recorded.prompt_ids           # same tokenizer, same chat template
    assert live.config == recorded.config and live.error is None
    assert at.segmented_control(key=keys.TOUR_SOURCE).value == "Live"
    assert at.success or any("differs from the recording" in w.value for w in at.warning)
    at.segmented_control(key=keys.TOUR_SOURCE).set_value("Recorded").run()
    ok(at)
    assert any(t.value.startswith(f"{recorded.stats.new_tokens} tokens") and "model default on" in t.value
               for t in at.text)
    speed = [c.value for c in at.caption if c.value.startswith("Speed: live ")]
    assert len(speed) == 1 and "recorded" in speed[0] and "depends on the machine" in speed[0]


def test_a_stop_opens_in_the_playground_with_its_settings(no_model):
    """Issue 46: no way led from a Tour stop to the Playground. The button switches page with the stop's
    prompt, strategy and parameters in the sidebar; a parameter the stop does not set is at its default."""
    stop = tour.stop_by_id("speculative")
    at = tour_app({"stop": "speculative"})
    assert any("runs its own settings (speculative" in i.value for i in at.sidebar.info)
    at.session_state[keys.param_key("w", "speculative", "gamma_policy")] = "heuristic"   # the user's, earlier
    at.button(key=keys.TOUR_OPEN).click().run()
    ok(at)
    state = at.session_state
    assert state[keys.PROMPT] == stop.prompt and state[keys.STRATEGY] == "speculative" and state[keys.CHAT]
    assert state[keys.MAX_NEW] == stop.max_new_tokens and state[keys.TOP_N] == stop.top_n
    for name, value in stop.params:
        assert state[keys.param_key("w", "speculative", name)] == value, name
    assert state[keys.param_key("w", "speculative", "gamma_policy")] != "heuristic"
    assert not at.sidebar.info                                  # on the Playground: no Tour note


# ---------------------------------------------------------------- reproducibility on the embedded model

def test_assert_same_bites():
    base = {"steps": [{"token_id": 3, "logit": 26.2943}], "text": "a"}
    assert_same(base, {"steps": [{"token_id": 3, "logit": 26.29431}], "text": "a"})
    for other in ({"steps": [{"token_id": 4, "logit": 26.2943}], "text": "a"},
                  {"steps": [{"token_id": 3, "logit": 26.4}], "text": "a"},
                  {"steps": [], "text": "a"}, {"steps": [{"token_id": 3, "logit": 26.2943}], "text": "b"}):
        with pytest.raises(AssertionError):
            assert_same(base, other)


@pytest.mark.real
@pytest.mark.parametrize("stop_id", ["greedy", "speculative", "dspark"])
def test_recording_reproduces_on_the_embedded_model(real_lm, stop_id, tmp_path):
    """A stop recorded again equals its recording; a stop sized by a cost table ("auto" profiles each
    machine anew) is replayed with the recording's table and round overhead."""
    stop = tour.stop_by_id(stop_id)
    recorded = without_timings(tour.load_recorded(stop))
    again = without_timings(from_json(to_json(replay_recorded_costs(real_lm, stop, tmp_path))))
    assert_same(strip_cost_source(again), strip_cost_source(recorded))


def replay_recorded_costs(lm, stop, tmp_path):
    """The stop run again; with the recording's cost table and overhead when its rounds were sized by one."""
    import dataclasses

    from decoding.runner import run
    from decoding.runtime.cost_table import CostTable

    sizes = [s.size for s in tour.load_recorded(stop).steps if getattr(s, "size", None) is not None]
    if not sizes:
        return recorder.record_stop(lm, stop)
    table = tmp_path / "recorded-cost.json"
    CostTable(sizes[0].verify_ms, overhead_ms=sizes[0].overhead_ms).save(table)
    config = dataclasses.replace(stop.config(), cost_table=str(table))
    return run(lm, lm.encode(stop.prompt, chat_template=True), config, prompt_text=stop.prompt)


def strip_cost_source(data):
    """The trace's plain form without the table's file name (and the config naming it)."""
    if isinstance(data, dict):
        return {k: strip_cost_source(v) for k, v in data.items() if k not in ("cost_source", "cost_table")}
    if isinstance(data, list):
        return [strip_cost_source(v) for v in data]
    return data
