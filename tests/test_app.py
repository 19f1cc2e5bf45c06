"""The app through streamlit.testing.v1.AppTest, on a tiny random llama with the real tokenizer.

The page scripts live in app_pages/, not pages/: with a pages/ directory present, AppTest 1.67 treats
the app as a legacy multipage app and reruns the page file alone, skipping the entrypoint (so the
shared sidebar would not rerun)."""
from __future__ import annotations

import json
import re

import pytest
from app_support import new_app, ok, run_state, run_to_end, trace_json

from ui.widgets import keys


def test_playground_first_render(tiny_dir):
    at = new_app()
    ok(at)
    assert not at.error
    assert at.session_state["ds.settings"].model == str(tiny_dir)
    assert [s.key for s in at.sidebar.selectbox] == ["w.device", "w.dtype", "w.device_map", "w.strategy"]
    assert run_state(at).events == []
    assert any("Press **Step**" in i.value for i in at.info)


def test_step_run_to_end_back_forward_reset(tiny_dir):
    at = new_app()
    at.button(key="pg.step").click().run()
    ok(at)
    assert len(run_state(at).events) == 1 and at.session_state["ds.cursor"] == 0
    assert any('ds-origin-target' in h.value and 'data-step="0"' in h.value for h in at.html)
    run_to_end(at)
    ok(at)
    run = run_state(at)
    assert run.done and len(run.events) == 6 and at.session_state["ds.cursor"] == 5
    assert run.trace().stop_reason in ("max_new_tokens", "eos")
    at.button(key="pg.back").click().run()
    assert at.session_state["ds.cursor"] == 4
    at.button(key="pg.back").click().run()
    at.button(key="pg.forward").click().run()
    assert at.session_state["ds.cursor"] == 4
    assert len(run_state(at).events) == 6            # navigating records nothing new
    at.button_group(key="pg.view").set_value("All steps").run()
    ok(at)
    assert list(at.dataframe[0].value["step"]) == [0, 1, 2, 3, 4, 5]
    at.button(key="pg.reset").click().run()
    ok(at)
    assert run_state(at).events == [] and at.session_state["ds.cursor"] == -1


def test_the_candidates_table_is_drawn_only_while_its_expander_is_open(tiny_dir):
    at = new_app()
    at.button(key="pg.step").click().run()
    ok(at)
    def candidate_tables():
        return [d for d in at.dataframe if "p processed" in d.value.columns]
    assert [e.label for e in at.expander if e.label == "Candidates table"] and not candidate_tables()
    at.session_state["pg.cands_open"] = True                  # the user opens it: the fragment reruns
    at.run()
    assert len(candidate_tables()) == 1 and candidate_tables()[0].value["rank"].tolist()[:2] == [1, 2]
    at.button(key="pg.step").click().run()                   # it stays open from step to step
    ok(at)
    assert len(candidate_tables()) == 1 and at.session_state["ds.cursor"] == 1


def test_the_new_token_leaves_before_the_step_details(tiny_dir, monkeypatch):
    """stepper.head_start runs between the chips and the step panel, once per rerun that draws the panel."""
    from ui.widgets import step_panel, stepper

    order = []
    monkeypatch.setattr(stepper, "head_start", lambda: order.append("pause"))
    monkeypatch.setitem(step_panel.STEP_PANELS, "token", lambda step, ctx: order.append("panel"))
    at = new_app()
    at.button(key="pg.step").click().run()
    ok(at)
    assert order == ["pause", "panel"] and any('data-step="0"' in h.value for h in at.html)
    at.button_group(key="pg.view").set_value("All steps").run()
    assert order == ["pause", "panel"]                        # no panel, no pause


@pytest.mark.slow
def test_a_run_in_progress_draws_its_chips_and_the_step_details_once_it_ends(tiny_dir, monkeypatch):
    from ui.widgets import stepper

    monkeypatch.setattr(stepper, "CHUNK_S", 0.002)      # a few tiny-model steps per chunk
    monkeypatch.setattr(stepper, "rerun_fragment", lambda: None)   # one chunk per run(), not all of them
    at = new_app({"max_new": "30"})
    at.button(key="pg.run_end").click().run()
    ok(at)
    assert keys.RUNNING in at.session_state and 0 < len(run_state(at).events) < 30
    waiting = "The step's details are drawn when the run ends"
    assert any(waiting in c.value for c in at.caption)
    assert any("ds-chips" in h.value for h in at.html) and not at.get("plotly_chart")
    run_to_end(at)
    ok(at)
    assert run_state(at).done and at.get("plotly_chart")
    assert not any(waiting in c.value for c in at.caption)


@pytest.mark.slow
def test_stop_is_enabled_while_a_long_run_goes_and_disabled_once_it_has_finished(tiny_dir, monkeypatch):
    from ui.widgets import stepper

    monkeypatch.setattr(stepper, "CHUNK_S", 0.002)
    monkeypatch.setattr(stepper, "rerun_fragment", lambda: None)   # one chunk per run()
    def stop(at):
        shown = [b for b in at.button if b.label == "Stop"]
        assert len(shown) == 1
        return shown[0]

    at = new_app({"max_new": "30"})
    assert stop(at).disabled
    at.button(key="pg.run_end").click().run()
    assert keys.RUNNING in at.session_state and not stop(at).disabled    # from the first chunk on
    run_to_end(at)
    ok(at)
    assert run_state(at).done and keys.RUNNING not in at.session_state
    assert stop(at).disabled                        # a run that ended in the last chunk: not left enabled
    at.button(key="pg.back").click().run()
    assert stop(at).disabled and stop(at).key == "pg.stop"


def test_sidebar_says_how_many_cpu_threads_the_engine_thread_has(tiny_dir):
    import torch

    from decoding.runtime.engine_thread import ENGINE

    at = new_app()
    ok(at)
    shown = [c.value for c in at.sidebar.caption if c.value.startswith("CPU threads for the model:")]
    assert len(shown) == 1
    assert int(re.match(r"CPU threads for the model: (\d+)", shown[0]).group(1)) == ENGINE.call(torch.get_num_threads)


def test_run_n_steps(tiny_dir):
    at = new_app({"max_new": "10"})
    at.number_input(key="pg.n_steps").set_value(3)
    at.button(key="pg.run_n").click().run()
    ok(at)
    assert len(run_state(at).events) == 3 and not run_state(at).done


def test_choose_strategy_resets_and_samples(tiny_dir):
    at = new_app()
    at.button(key="pg.step").click().run()
    assert run_state(at).config.strategy == "greedy"
    at.sidebar.selectbox(key="w.strategy").set_value("sample").run()
    ok(at)
    assert run_state(at).config.strategy == "sample" and run_state(at).events == []
    assert [n.key for n in at.sidebar.number_input][:4] == ["w.param.sample.temperature", "w.param.sample.top_k",
                                                            "w.param.sample.top_p", "w.param.sample.min_p"]
    at.sidebar.number_input(key="w.param.sample.temperature").set_value(0.5).run()
    at.sidebar.number_input(key="w.param.sample.top_k").set_value(4).run()
    at.button(key="pg.step").click().run()
    ok(at)
    event = run_state(at).events[0]
    assert event.draw is not None and 0.0 <= event.draw < 1.0
    assert [f.name for f in event.filters] == ["temperature", "top_k"]
    assert sum(c.removed_by is None for c in event.processed_top) == 4


def test_invalid_parameter_is_an_inline_error(tiny_dir):
    at = new_app({"strategy": "sample", "temperature": "0"})
    ok(at)
    sidebar_errors = [e.value for e in at.sidebar.error]
    assert sidebar_errors and sidebar_errors[0].startswith("temperature=0.0 is invalid")
    assert any("Fix the sidebar first" in e.value for e in at.main.error)


def test_bad_model_is_an_error_not_a_traceback(tiny_dir, tmp_path):
    at = new_app({"model": str(tmp_path / "nothing-here")})
    ok(at)
    assert any(e.value.startswith("model=") for e in at.error)


def test_query_params_reproduce_the_settings(tiny_dir):
    query = {"strategy": "sample", "seed": "7", "temperature": "0.7", "top_k": "5", "prompt": "Hi there",
             "chat": "0", "top_n": "5"}
    at = new_app(query)
    ok(at)
    settings = at.session_state["ds.settings"]
    assert (settings.strategy, settings.seed, settings.prompt, settings.chat_template) == ("sample", 7, "Hi there",
                                                                                          False)
    assert settings.config.temperature == 0.7 and settings.config.top_k == 5 and settings.config.top_n == 5
    for name, value in query.items():           # the URL is written back
        assert at.query_params[name] == value or float(at.query_params[name]) == float(value)


def test_force_a_candidate_branches(tiny_dir):
    at = new_app()
    at.number_input(key="pg.n_steps").set_value(4)
    at.button(key="pg.run_n").click().run()
    at.button(key="pg.back").click().run()       # view step 2
    original = list(run_state(at).events)
    step = original[2]
    at.selectbox(key="pg.force_pick").set_value(3)
    at.button(key="pg.force").click().run()
    ok(at)
    branch = at.session_state["ds.branch"]
    forced_id = step.raw_top[3].token_id
    assert branch.events[:2] == original[:2]
    assert branch.events[2].chosen_id == forced_id and branch.events[2].forced
    assert len(branch.events) == len(original)
    assert run_state(at).events == original        # the original run is kept for comparison
    assert at.session_state["pg.view"] == "Branch"
    assert any('class="ds-diverge"' in h.value for h in at.html)
    at.button(key="pg.adopt_branch").click().run()
    ok(at)
    assert run_state(at).events[2].chosen_id == forced_id
    at.button(key="pg.step").click().run()       # the adopted branch keeps stepping
    assert len(run_state(at).events) == 5


def test_compare_page(tiny_dir):
    at = new_app()
    at.switch_page("app_pages/compare.py").run()
    ok(at)
    assert [s.value for s in at.selectbox if s.key.startswith("cmp")] == ["greedy", "sample"]
    at.button(key="cmp.run").click().run()
    ok(at)
    traces = at.session_state["ds.compare"]
    assert list(traces) == ["1: greedy", "2: sample"]
    table = at.dataframe[0].value
    assert list(table["lane"]) == ["1: greedy", "2: sample"] and (table["tokens"] == 6).all()


@pytest.mark.slow
def test_traces_page_download_and_replay(tiny_dir):
    from decoding.core.trace import from_json, to_dict

    at = new_app()
    text = trace_json(at)
    at.switch_page("app_pages/traces.py").run()
    ok(at)
    assert at.get("download_button")                     # the playground trace can be saved
    fresh = new_app()                                    # replay needs no run and no model call
    fresh.switch_page("app_pages/traces.py").run()
    fresh.file_uploader(key="tr.upload").set_value(("t.json", text.encode(), "application/json")).run()
    ok(fresh)
    assert not fresh.error
    replay = fresh.session_state["ds.replay"]
    assert to_dict(replay) == to_dict(from_json(text))
    assert any(f'data-step="{len(replay.steps) - 1}"' in h.value for h in fresh.html)
    fresh.slider(key="ds.replay_cursor").set_value(2).run()
    ok(fresh)
    current = re.compile(r'class="[^"]*ds-current[^"]*"[^>]*data-step="(\d+)"')
    assert [m for h in fresh.html for m in current.findall(h.value)] == ["2"]


def test_replay_escapes_hostile_pieces(tiny_dir):
    at = new_app()
    data = json.loads(trace_json(at))
    step = data["steps"][0]
    step["chosen_piece"] = "<script>alert(1)</script>"
    step["raw_top"][0]["piece"] = '<img src=x onerror="alert(2)">'
    at.switch_page("app_pages/traces.py").run()
    at.file_uploader(key="tr.upload").set_value(("evil.json", json.dumps(data).encode(), "application/json")).run()
    ok(at)
    html = "".join(h.value for h in at.html)
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.parametrize("payload, message", [
    (b"{not json", "not valid JSON"),
    (json.dumps({"schema_version": "9.0", "steps": []}).encode(), "schema_version"),
    (json.dumps([1, 2]).encode(), "JSON object"),
])
def test_traces_page_refuses_malformed_files(tiny_dir, payload, message):
    at = new_app()
    at.switch_page("app_pages/traces.py").run()
    at.file_uploader(key="tr.upload").set_value(("bad.json", payload, "application/json")).run()
    ok(at)
    assert any(message in e.value for e in at.error)
    assert "ds.replay" not in at.session_state


def test_traces_page_refuses_oversized_files(tiny_dir, monkeypatch):
    import decoding.core.trace

    monkeypatch.setattr(decoding.core.trace, "MAX_TRACE_BYTES", 100)
    at = new_app()
    at.switch_page("app_pages/traces.py").run()
    at.file_uploader(key="tr.upload").set_value(("big.json", b" " * 500, "application/json")).run()
    ok(at)
    assert any("over the 100 byte limit" in e.value for e in at.error)


def test_unreadable_link_parameters_are_named(tiny_dir):
    at = new_app({"seed": "abc", "strategy": "beam-me-up"})
    ok(at)
    assert any("seed" in w.value and "strategy" in w.value for w in at.sidebar.warning)
    assert at.session_state["ds.settings"].strategy == "greedy"


@pytest.mark.real
def test_playground_on_the_embedded_model(tiny_dir, real_lm):
    """The default model through the app gives plain greedy's tokens, and readable chips."""
    from decoding.core.config import GreedyConfig
    from decoding.runner import run

    at = new_app({"model": "default", "max_new": "8", "prompt": "What is 2+2?"})
    run_to_end(at)
    ok(at)
    live = run_state(at)
    truth = run(real_lm, real_lm.encode("What is 2+2?"), GreedyConfig(max_new_tokens=8))
    assert live.output_ids == list(truth.output_ids)
    assert live.trace().text == truth.text and truth.text.strip()


@pytest.mark.slow
def test_compare_three_lanes_and_a_bad_parameter(tiny_dir):
    at = new_app()
    at.switch_page("app_pages/compare.py").run()
    at.number_input(key="cmp.lanes").set_value(3).run()
    ok(at)
    assert [s.key for s in at.selectbox if s.key.startswith("cmp")] == ["cmp0.strategy", "cmp1.strategy",
                                                                        "cmp2.strategy"]
    at.number_input(key="cmp1.param.sample.top_p").set_value(1.5).run()
    assert any(e.value.startswith("top_p=1.5 is invalid") for e in at.error)
    assert at.button(key="cmp.run").disabled
    at.number_input(key="cmp1.param.sample.top_p").set_value(0.9).run()
    at.selectbox(key="cmp2.strategy").set_value("greedy").run()     # the default cycles through all strategies
    at.button(key="cmp.run").click().run()
    ok(at)
    traces = at.session_state["ds.compare"]
    assert list(traces) == ["1: greedy", "2: sample", "3: greedy"]
    assert traces["1: greedy"].output_ids == traces["3: greedy"].output_ids      # same prompt and seed
    assert traces["2: sample"].config["top_p"] == 0.9
