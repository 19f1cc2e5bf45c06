"""AppTest of the beam and speculative views and the What-if page, on the tiny random llama with the
real tokenizer (fixtures and helpers shared with test_app)."""
from __future__ import annotations

import json
import re

import pytest
from app_support import REPEAT, html_of, new_app, ok, run_state, run_to_end, trace_json

from ui.widgets import keys


@pytest.mark.slow
def test_beam_step_run_to_end_tree_and_pool(tiny_dir):
    at = new_app({"strategy": "beam", "num_beams": "3", "max_new": "5"})
    ok(at)
    at.button(key="pg.step").click().run()
    ok(at)
    run = run_state(at)
    assert len(run.events) == 1 and run.events[0].kind == "beam"
    tree = at.get("graphviz_chart")
    assert tree and "digraph beam" in tree[0].proto.spec and "prompt" in tree[0].proto.spec
    pool = at.dataframe[0].value
    assert list(pool["status"]).count("kept") == 3
    assert 'data-step="0"' in html_of(at)
    run_to_end(at)
    ok(at)
    run = run_state(at)
    assert run.done and run.events[-1].done
    chips = re.findall(r'<span class="ds-chip ds-origin-target[^"]*"[^>]*data-step="(\d+)"', html_of(at))
    assert len(chips) == len(run.output_ids) and run.trace().output_ids == tuple(run.output_ids)
    at.button_group(key="pg.view").set_value("All steps").run()
    ok(at)
    assert list(at.dataframe[0].value["step"]) == list(range(len(run.events)))


def test_speculative_lookup_step_and_run_to_end_equals_greedy(tiny_dir):
    from decoding.core.config import GreedyConfig
    from decoding.runner import run as run_engine

    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "12", "prompt": REPEAT,
                  "chat": "0"})
    ok(at)
    assert "w.param.speculative.draft" in [t.key for t in at.sidebar.text_input]
    at.button(key="pg.step").click().run()
    ok(at)
    live = run_state(at)
    event = live.events[0]
    assert event.kind == "spec_round" and event.drafter == "lookup"
    assert any("γ =" in t.value for t in at.text)
    run_to_end(at)
    ok(at)
    live = run_state(at)
    greedy = run_engine(live.lm, live.prompt_ids, GreedyConfig(max_new_tokens=12))
    assert live.output_ids == list(greedy.output_ids)                 # temperature 0: exactly greedy
    html = html_of(at)
    accepted = sum(e.accepted for e in live.events)
    count = lambda origin: len(re.findall(rf'ds-chip ds-origin-{origin}[^>]*data-step=', html))  # noqa: E731
    assert count("accepted") == accepted >= 1                        # the tiny model repeats: lookup hits
    assert count("rejected") == sum(
        1 for e in live.events if any(d.verdict == "rejected" for d in e.drafts))
    assert any(m.label.startswith("τ") for m in at.metric)


@pytest.mark.slow
def test_speculative_with_a_draft_model(tiny_dir):
    at = new_app({"strategy": "speculative", "gamma": "3", "max_new": "6", "temperature": "0.9", "seed": "2"})
    at.sidebar.text_input(key="w.param.speculative.draft").set_value(str(tiny_dir)).run()
    ok(at)
    assert not at.error
    run_to_end(at)
    ok(at)
    live = run_state(at)
    assert live.done and live.events[0].drafter != "lookup"
    assert all(d.q_draft is not None for e in live.events for d in e.drafts)
    assert all(e.drafts for e in live.events[:-1])
    html = html_of(at)
    assert "q draft 0." in html or "q draft 1." in html      # tooltips carry the numbers


def test_speculative_lookup_then_draft_model(tiny_dir):
    """draft 'lookup+PATH': lookup rounds where the context repeats, the draft model's elsewhere; the
    round view names the drafter of the round shown."""
    at = new_app({"strategy": "speculative", "gamma": "3", "max_new": "12", "prompt": "one two three four five",
                  "chat": "0"})
    field = at.sidebar.text_input(key="w.param.speculative.draft")
    assert "lookup+MODEL" in field.help                    # the field's tooltip says what it takes
    field.set_value(f"lookup+{tiny_dir}").run()
    ok(at)
    assert not at.error
    run_to_end(at)
    ok(at)
    live = run_state(at)
    sources = [e.drafter for e in live.events]
    assert live.done and "lookup" in sources and any(not s.startswith("lookup") for s in sources), sources
    last = live.events[-1]
    assert any(t.value.startswith(f"Drafter: {last.drafter}") for t in at.text)


@pytest.mark.slow
def test_speculative_cost_policy(tiny_dir, tmp_path, monkeypatch):
    """gamma policy 'cost' (the Advanced cost table at none = auto): each round records its choice and
    the round view has the table of ms per expected token for every γ."""
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "4", "max_new": "8", "prompt": REPEAT,
                  "chat": "0", "gamma_policy": "cost"})
    ok(at)
    assert not at.error
    assert "cost: per round" in at.sidebar.selectbox(key="w.param.speculative.gamma_policy").help
    run_to_end(at)
    ok(at)
    live = run_state(at)
    assert live.done and all(e.gamma_choice is not None for e in live.events)
    assert any(e.label.startswith("Cost-aware γ: why") for e in at.expander)
    shown = [d.value for d in at.dataframe if "ms per expected token" in d.value.columns]
    assert shown and int(shown[0]["chosen"].sum()) == 1 and list(shown[0]["γ"]) == [1, 2, 3, 4]
    at.switch_page("app_pages/whatif.py").run()                      # the What-if prices every γ with it
    ok(at)
    table = at.dataframe[0].value
    assert table["expected ms per token"].notna().sum() == 4           # γ 1-4: the table covers 5 tokens
    assert any("the fastest fixed γ would be" in c.value for c in at.caption)


def test_speculative_cost_table_needs_the_cost_policy(tiny_dir):
    at = new_app({"strategy": "speculative", "cost_table": "auto"})
    ok(at)
    assert any(e.value.startswith("cost_table='auto' is invalid: is used by gamma_policy 'cost' only")
               for e in at.error)


def test_speculative_unloadable_draft_is_an_error(tiny_dir, tmp_path):
    at = new_app({"strategy": "speculative"})
    at.sidebar.text_input(key="w.param.speculative.draft").set_value(str(tmp_path / "no-draft")).run()
    ok(at)
    assert any(e.value.startswith("draft=") for e in at.error)


def test_whatif_page_from_the_playground_run(tiny_dir):
    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "12", "prompt": REPEAT,
                  "chat": "0", "gamma_max": "6"})
    run_to_end(at)
    at.switch_page("app_pages/whatif.py").run()
    ok(at)
    table = at.dataframe[0].value
    assert list(table["γ"])[:6] == [1, 2, 3, 4, 5, 6]
    row = table[table["γ"] == 3].iloc[0]
    rounds = run_state(at).events
    assert abs(row["expected accepted"] - sum(e.accepted for e in rounds) / len(rounds)) < 1e-9   # T=0: exact
    assert any("independent" in m.value for m in at.markdown)


def test_whatif_page_upload_refuses_other_strategies_and_bad_files(tiny_dir):
    at = new_app()
    text = trace_json(at)                                   # a greedy trace
    at.switch_page("app_pages/whatif.py").run()
    at.button_group(key="wi.source").set_value("Upload a trace").run()
    at.file_uploader(key="wi.upload").set_value(("g.json", text.encode(), "application/json")).run()
    ok(at)
    assert any("needs speculative or dspark rounds" in w.value for w in at.warning)
    at.file_uploader(key="wi.upload").set_value(("bad.json", b"{nope", "application/json")).run()
    ok(at)
    assert any("not a readable trace" in e.value for e in at.error)


def test_whatif_page_upload_of_a_speculative_trace(tiny_dir):
    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "2", "max_new": "8", "prompt": REPEAT,
                  "chat": "0"})
    text = trace_json(at)
    fresh = new_app()
    fresh.switch_page("app_pages/whatif.py").run()
    fresh.button_group(key="wi.source").set_value("Upload a trace").run()
    fresh.file_uploader(key="wi.upload").set_value(("s.json", text.encode(), "application/json")).run()
    ok(fresh)
    assert not fresh.error and list(fresh.dataframe[0].value["γ"])[:2] == [1, 2]


@pytest.mark.slow
def test_replay_escapes_hostile_pieces_in_spec_and_beam_traces(tiny_dir):
    spec_at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "8", "prompt": REPEAT,
                       "chat": "0", "temperature": "1.0"})
    data = json.loads(trace_json(spec_at))
    for step in data["steps"]:
        for draft in step["drafts"]:
            draft["piece"] = "<script>alert(1)</script>"
        step["gamma_reason"] = "[a link](https://example.com) <b>x</b>"
    spec_at.switch_page("app_pages/traces.py").run()
    spec_at.file_uploader(key="tr.upload").set_value(("evil.json", json.dumps(data).encode(), "application/json")).run()
    ok(spec_at)
    html = html_of(spec_at)
    assert "<script>" not in html and "<b>" not in html
    assert any("[a link](https://example.com)" in t.value for t in spec_at.text)   # shown as text

    beam_at = new_app({"strategy": "beam", "num_beams": "2", "max_new": "3"})
    data = json.loads(trace_json(beam_at))
    data["steps"][0]["pool"][0]["piece"] = '"];\nevil [label="x'
    beam_at.switch_page("app_pages/traces.py").run()
    beam_at.file_uploader(key="tr.upload").set_value(("evil.json", json.dumps(data).encode(), "application/json")).run()
    beam_at.slider(key="ds.replay_cursor").set_value(0).run()
    ok(beam_at)
    dot = beam_at.get("graphviz_chart")[0].proto.spec
    assert not re.search(r"^\s*evil", dot, flags=re.M)     # no new statement: the quote is escaped
    assert '\\"];↵evil [label=\\"x' in dot


def test_compare_with_beam_and_speculative_lanes(tiny_dir):
    at = new_app({"max_new": "6"})
    at.switch_page("app_pages/compare.py").run()
    at.number_input(key="cmp.lanes").set_value(4).run()
    ok(at)
    lanes = [keys.lane_strategy(i) for i in range(4)]
    assert [at.selectbox(key=k).value for k in lanes] == ["greedy", "sample", "beam", "speculative"]
    at.button(key="cmp.run").click().run()
    ok(at)
    traces = at.session_state["ds.compare"]
    assert traces["4: speculative"].output_ids == traces["1: greedy"].output_ids    # lookup at T=0 is greedy
    streams = [h.value for h in at.html if 'class="ds-chips"' in h.value and "data-step" in h.value]
    beam_chips = re.findall(r"data-step=", streams[2])
    assert len(beam_chips) == len(traces["3: beam"].output_ids)


@pytest.mark.real
def test_speculative_lookup_on_the_embedded_model_is_greedy(tiny_dir, real_lm):
    """Prompt lookup at temperature 0 through the app gives plain greedy's tokens on the real model."""
    from decoding.core.config import GreedyConfig
    from decoding.runner import run as run_engine

    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."
    at = new_app({"model": "default", "strategy": "speculative", "draft": "lookup", "gamma": "4", "max_new": "24",
                  "prompt": prompt})
    run_to_end(at)
    ok(at)
    live = run_state(at)
    truth = run_engine(real_lm, real_lm.encode(prompt), GreedyConfig(max_new_tokens=24))
    assert live.output_ids == list(truth.output_ids)
    assert sum(e.accepted for e in live.events) >= 1 and len(live.events) < len(truth.output_ids)


@pytest.mark.slow
def test_whatif_page_upload_of_a_dspark_trace(tiny_dir):
    from dspark_helpers import random_drafter

    from decoding.core.config import DSparkConfig
    from decoding.core.trace import to_json
    from decoding.runner import run as run_engine
    from decoding.runtime.models import ModelSpec, load

    lm = load(ModelSpec(str(tiny_dir)))
    trace = run_engine(lm, lm.encode("Hello there"), DSparkConfig(max_new_tokens=12, gamma=4),
                       drafter=random_drafter(lm, gamma_max=4, seed=1))
    at = new_app()
    at.switch_page("app_pages/whatif.py").run()
    at.button_group(key="wi.source").set_value("Upload a trace").run()
    at.file_uploader(key="wi.upload").set_value(("d.json", to_json(trace).encode(), "application/json")).run()
    ok(at)
    assert not at.error
    table = at.dataframe[0].value
    assert list(table["plan"]) == ["chain"] * 4 + ["tree"] * 3
    assert table["replayed tokens per forward"].notna().all()         # temperature 0: exact replay
    assert any("Forecast" in m.value for m in at.markdown)


def test_fields_with_known_choices_are_selectboxes():
    at = new_app({"strategy": "speculative"})
    ok(at)
    assert list(at.sidebar.selectbox(key="w.param.speculative.gamma_policy").options) == [
        "fixed", "heuristic", "confidence", "cost"]
    at = new_app({"strategy": "dspark", "select": "tree"})
    ok(at)
    assert at.sidebar.selectbox(key="w.param.dspark.select").value == "tree"


def test_an_unknown_choice_from_a_link_is_named():
    """A link with gamma_policy=x: refused with a line naming it and the choices; the field keeps its default."""
    at = new_app({"strategy": "speculative", "gamma_policy": "x"})
    ok(at)
    assert any(e.value == "gamma_policy='x' is invalid: choose one of fixed, heuristic, confidence, cost (ignored)"
               for e in at.error)
    assert at.sidebar.selectbox(key="w.param.speculative.gamma_policy").value == "fixed"
