"""AppTest of the Lab page on the tiny random llama: each measurement runs from its button, shows its
sentence, chart and tables and the settings that made them (marked out of date, not dropped, when they
change), stays cached for the same settings and is measured again on request; bad
points, a point beyond the device's memory and a model that does not load are one-line error boxes."""
from __future__ import annotations

import pytest
from app_support import chart_titled, frame_with, new_app, ok
from md_helpers import shown

from ui.widgets import keys

LAB = "app_pages/lab.py"


def lab_page(query: dict | None = None):
    at = new_app(query)
    at.switch_page(LAB).run()
    ok(at)
    return at


def errors(at) -> list[str]:
    """The error boxes' text as the reader sees it (their Markdown read)."""
    return [shown(e.value) for e in at.error]


@pytest.mark.slow
def test_cost_of_a_forward_measures_and_stays(tiny_dir):
    at = lab_page()
    assert any("Not measured yet for this model, device and these points" in c.value for c in at.caption)
    at.text_input(key=keys.LAB_TOKENS).set_value("1, 3, 9")
    at.text_input(key=keys.LAB_BATCHES).set_value("1, 2")
    at.number_input(key=keys.LAB_REPEATS).set_value(1)
    at.button(key=keys.LAB_COST_RUN).click().run()
    ok(at)
    assert not errors(at)
    assert any("a one-token forward" in m.value for m in at.markdown)
    fig = chart_titled(at, "Cost of a forward")
    assert [t["name"][:12] for t in fig["data"]] == ["measured: n ", "measured: b ", "roofline: le"]
    table = frame_with(at, "roofline (ms)")
    assert list(table["n"]) == [1, 3, 9, 1, 2]
    assert list(frame_with(at, "τ to beat greedy")["γ"]) == [2, 8]
    assert "ridge" in list(frame_with(at, "quantity")["quantity"])
    store = at.session_state[keys.LAB]
    assert len(store) == 1
    events = next(iter(store.values()))
    at.run()                                                    # cached: shown again without measuring
    ok(at)
    assert next(iter(at.session_state[keys.LAB].values())) is events
    assert frame_with(at, "roofline (ms)").shape[0] == 5
    at.button(key=keys.LAB_COST_RUN).click().run()               # measured again on request
    assert next(iter(at.session_state[keys.LAB].values())) is not events
    made = [c.value for c in at.caption if c.value.startswith("Made with:")]
    assert len(made) == 1 and "n 1, 3, 9 · b 1, 2 · repeats 1" in shown(made[0]) and not at.warning
    at.number_input(key=keys.LAB_REPEATS).set_value(2).run()      # other settings: the result stays, out of date
    warnings = [shown(w.value) for w in at.warning]
    assert len(warnings) == 1 and "repeats 1 → 2" in warnings[0] and "press Measure" in warnings[0]
    assert frame_with(at, "roofline (ms)").shape[0] == 5 and not any("Made with:" in c.value for c in at.caption)
    at.number_input(key=keys.LAB_REPEATS).set_value(1).run()      # back: current again
    assert not at.warning and any(c.value.startswith("Made with:") for c in at.caption)


@pytest.mark.parametrize(("field", "text", "words"), [
    (keys.LAB_TOKENS, "1, two", "tokens='1, two' is invalid: must be integers"),
    (keys.LAB_TOKENS, "1, 300", "tokens=(1, 300) is invalid: must be a non-empty list of integers in [1, 256]"),
    (keys.LAB_BATCHES, "0", "batches=(0,) is invalid: must be"),
])
def test_bad_points_are_one_line_errors(tiny_dir, field, text, words):
    at = lab_page()
    at.text_input(key=field).set_value(text).run()
    ok(at)
    assert any(words in e for e in errors(at)), errors(at)
    assert keys.LAB_COST_RUN not in [b.key for b in at.button]          # nothing to measure with


def test_a_point_beyond_memory_is_an_error_box(tiny_dir, monkeypatch):
    from batch_support import batches_up_to

    from decoding.lab import forward_cost

    monkeypatch.setattr(forward_cost, "batch_times", batches_up_to(2))
    at = lab_page()
    at.text_input(key=keys.LAB_TOKENS).set_value("1")
    at.text_input(key=keys.LAB_BATCHES).set_value("1, 2, 4")
    at.number_input(key=keys.LAB_REPEATS).set_value(1)
    at.button(key=keys.LAB_COST_RUN).click().run()
    ok(at)
    assert errors(at) == ["batches=2 is invalid: does not fit in memory on cpu; measure fewer or smaller points"]
    assert not at.session_state[keys.LAB]


def test_a_model_that_does_not_load_is_an_error_box(tiny_dir, tmp_path):
    missing = tmp_path / "no-such-model"
    at = lab_page()
    at.sidebar.text_input(key=keys.MODEL).set_value(str(missing)).run()
    at.switch_page(LAB).run()
    at.text_input(key=keys.LAB_TOKENS).set_value("1")
    at.button(key=keys.LAB_COST_RUN).click().run()
    ok(at)
    assert any("model=" in e for e in errors(at)), errors(at)


def test_throughput_measures_each_batch(tiny_dir):
    at = lab_page()
    at.text_input(key=keys.LAB_TP_BATCHES).set_value("4, 1")
    at.number_input(key=keys.LAB_TP_STEPS).set_value(2)
    at.button(key=keys.LAB_TP_RUN).click().run()
    ok(at)
    assert not errors(at)
    assert any("From b = 1 to b = 4" in m.value for m in at.markdown)
    assert list(frame_with(at, "latency p99 (ms per token)")["batch"]) == [1, 4]
    assert chart_titled(at, "Throughput against latency")["data"][0]["type"] == "bar"


def test_acceptance_shows_the_playground_rounds(tiny_dir):
    from app_support import run_state, run_to_end

    at = lab_page()
    assert any("Run something in the Playground" in c.value for c in at.caption)
    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "12",
                  "prompt": "one two one two one two one two"})
    run_to_end(at)
    rounds = [e for e in run_state(at).events if e.kind == "spec_round" and e.gamma]
    assert rounds                                       # the tiny model repeats itself: lookup drafts
    at.switch_page(LAB).run()
    ok(at)
    heat = chart_titled(at, "Acceptance per round and draft position")["data"][0]
    assert heat["y"] == [f"round {e.index}" for e in rounds]
    assert list(frame_with(at, "not reached")["rounds"])[0] == len(rounds)


def test_acceptance_of_a_run_without_drafts_says_so(tiny_dir):
    from app_support import run_to_end

    at = new_app({"strategy": "greedy", "max_new": "4"})
    run_to_end(at)
    at.switch_page(LAB).run()
    ok(at)
    assert any("verified no drafts" in i.value for i in at.info)


def test_memory_of_the_playground_run(tiny_dir):
    from app_support import run_state, run_to_end

    at = new_app({"strategy": "beam", "num_beams": "3", "max_new": "5"})
    run_to_end(at)
    steps = run_state(at).events
    at.switch_page(LAB).run()
    ok(at)
    assert any("3 sequences" in m.value for m in at.markdown)
    line = chart_titled(at, "KV cache held")["data"][0]
    assert line["y"] == [s.kv.bytes / 1e6 for s in steps]
    assert list(frame_with(at, "held (MB)")["sequences"]) == [3] * len(steps)


@pytest.mark.slow
def test_compare_draws_the_cache_of_each_lane(tiny_dir):
    at = new_app({"max_new": "4"})
    at.switch_page("app_pages/compare.py").run()
    at.selectbox(key=keys.lane_strategy(0)).set_value("greedy")
    at.selectbox(key=keys.lane_strategy(1)).set_value("beam").run()
    at.button(key=keys.COMPARE_RUN).click().run()
    ok(at)
    lines = chart_titled(at, "KV cache held")["data"]
    assert [d["name"] for d in lines] == ["1: greedy", "2: beam"]
    beams = at.session_state[keys.COMPARE]["2: beam"].steps[0].kv.sequences
    assert lines[1]["y"][0] == pytest.approx(beams * lines[0]["y"][0])


def test_losslessness_measures_and_refuses_no_samples(tiny_dir):
    at = lab_page()
    assert frame_with(at, "P(A)").shape[0] == 5                       # the worked example needs no model
    at.number_input(key=keys.LAB_LL_SAMPLES).set_value(500)
    at.button(key=keys.LAB_LL_RUN).click().run()
    ok(at)
    assert not errors(at)
    table = frame_with(at, "claims lossless")
    assert list(table["samples"]) == [500] * 4
    assert chart_titled(at, "exact distribution under each rule")["data"][0]["name"].startswith("p target")
    at.number_input(key=keys.LAB_LL_SAMPLES).set_value(0).run()
    assert "samples=0 is invalid: must be an integer in [1, 100000]" in errors(at)


def test_queueing_measured_live_beside_the_simulation(tiny_dir):
    """The Queueing tab's live measurement on the tiny model: greedy and prompt lookup, 5 requests of 4 tokens;
    the table in words (the simulation's P99 beside the measured one), the sentence and the chart."""
    at = lab_page()
    at.selectbox(key="lab.q.live.faster").set_value("Speculative, prompt lookup")
    at.number_input(key="lab.q.live.requests").set_value(5)
    at.number_input(key="lab.q.live.tokens").set_value(4)
    at.button(key="lab.q.live.run").click().run()
    ok(at)
    assert not errors(at)
    table = frame_with(at, "P99 simulated (s)")
    assert list(table["Strategy"]) == ["greedy", "speculative"] and list(table["Requests"]) == [5, 5]
    assert any(m.value.startswith("Per request, speculative was") for m in at.markdown)    # faster or not
    assert chart_titled(at, "measured live")["data"][0]["name"] == "greedy"
