"""AppTest of the DSpark views (playground panel, chips, replay) and the compare page's speedup column
and charts, on the tiny random llama with the real tokenizer and a drafter built for it here."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from app_support import (
    chart_titled,
    charts,
    drafter_file,  # noqa: F401  (a fixture)
    frame_with,
    html_of,
    new_app,
    ok,
    run_state,
    run_to_end,
    trace_json,
)
from dspark_helpers import APP_CHAIN, chain_config

from ui.views import headers
from ui.views.sources import source_text


def exports(at) -> dict[str, str]:
    """What each chart's toolbar camera saves: file name -> format (plotly.js draws it in the browser)."""
    opts = [json.loads(c.proto.config)["toImageButtonOptions"] for c in at.get("plotly_chart")]
    return {o["filename"]: o["format"] for o in opts}


def count(html: str, origin: str) -> int:
    return len(re.findall(rf'ds-chip ds-origin-{origin}[^>]*data-step=', html))


@pytest.mark.slow
def test_dspark_chain_round_panel_and_run_to_end(tiny_dir, drafter_file):
    from decoding.core.config import GreedyConfig
    from decoding.runner import run as run_engine

    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "top_k_candidates": "2",
                  "max_new": "8"})
    ok(at)
    assert not at.error
    at.button(key="pg.step").click().run()
    ok(at)
    assert run_state(at).events[0].prefill and any("Prefill" in i.value for i in at.info)
    at.button(key="pg.step").click().run()
    ok(at)
    event = run_state(at).events[1]
    assert event.kind == "dspark_round" and event.select == "chain" and len(event.lattice) == 3
    lattice = chart_titled(at, "lattice")
    heat = lattice["data"][0]
    assert heat["type"] == "heatmap" and len(heat["z"]) == 2 and len(heat["z"][0]) == 3
    names = {t.get("name") for t in lattice["data"]}
    assert {"✓ accepted", "✗ rejected"} <= names
    dp = frame_with(at, "on the chosen chain")
    assert int(dp["on the chosen chain"].sum()) == len(event.dp.path) == len(event.nodes)
    verdicts = frame_with(at, "acceptance probability")
    assert list(verdicts["verdict"])[:-1] == [headers.VALUE_WORDS["verdict"].get(n.verdict, n.verdict)
                                              for n in event.nodes]
    assert list(verdicts["verdict"])[-1] == f"next: {event.next_from}"
    assert any(m.label.startswith("τ") for m in at.metric)
    chart_titled(at, "Share of the drafting rounds' time")
    saved = exports(at)
    assert {f"round{event.index}-lattice", "step1-timing"} <= set(saved) and set(saved.values()) == {"svg"}
    assert not [k for k in _keys(at) if k.endswith(".svg")]         # no SVG drawn on the server any more
    for chart in charts(at):       # margins fixed on the server: no automargin pass in the browser
        axes = [v for k, v in chart["layout"].items() if k.startswith(("xaxis", "yaxis"))]
        assert axes and all(a.get("automargin") is False for a in axes), chart["layout"].get("title")

    at.radio(key="pg.ds_value").set_value("q_draft").run()
    ok(at)
    assert chart_titled(at, "lattice")["data"][0]["colorbar"]["title"]["text"] == "q draft"

    run_to_end(at)
    ok(at)
    live = run_state(at)
    greedy = run_engine(live.lm, live.prompt_ids, GreedyConfig(max_new_tokens=8))
    assert live.output_ids == list(greedy.output_ids)                 # temperature 0: exactly greedy
    html = html_of(at)
    rounds = [e for e in live.events if not e.prefill]
    accepted = sum(len(e.accepted_path) for e in rounds)
    rejected = sum(n.verdict == "rejected" for e in rounds for n in e.nodes)
    assert count(html, "accepted") == accepted >= 1 and count(html, "rejected") == rejected >= 1
    at.button_group(key="pg.view").set_value("All steps").run()
    ok(at)
    steps = frame_with(at, "next token from")
    assert list(steps["accepted"]) == [len(e.accepted_path) for e in live.events]


def _keys(at) -> set[str]:
    """Keys of the download buttons on the page (an id reads "$$ID-<hash>-<key>")."""
    return {b.proto.id.split("-", 2)[-1] for b in at.get("download_button")}


def test_dspark_tree_round_panel(tiny_dir, drafter_file):
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "top_k_candidates": "3",
                  "select": "tree", "budget": "5", "max_new": "6"})
    for _ in range(2):
        at.button(key="pg.step").click().run()
    ok(at)
    event = run_state(at).events[1]
    assert event.select == "tree" and event.dp is None and len(event.nodes) == 5
    assert any("Tree mode" in c.value for c in at.caption)
    assert not [d for d in at.dataframe if "on the chosen chain" in d.value.columns]       # no DP table in tree mode
    assert len(frame_with(at, "acceptance probability")) == len(event.nodes) + 1
    summary = frame_with(at, "quantity").set_index("quantity")["value"]
    assert summary["tree nodes verified"] == "5" and summary["mode"] == "tree (best-first)"


@pytest.mark.slow
def test_dspark_with_prompt_lookup_candidates(tiny_dir, drafter_file):
    """The tiny model repeats one token, so lookup matches from the second round on: its cells are
    marked on the lattice, its nodes in the verdicts table, its match and rates in the summary."""
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "top_k_candidates": "2",
                  "lookup_max_ngram": "2", "max_new": "12"})
    for _ in range(4):
        at.button(key="pg.step").click().run()
    ok(at)
    event = run_state(at).events[-1]
    assert event.lookup is not None and event.lookup_scores is not None
    names = {t.get("name") for t in chart_titled(at, "lattice")["data"]}
    assert "prompt lookup's token (framed)" in names
    verdicts = frame_with(at, "acceptance probability")
    assert list(verdicts["source"])[:-1] == [source_text(n) for n in event.nodes]
    assert any("prompt lookup" in s for s in verdicts["source"])
    assert all(n.sources for n in event.nodes)
    summary = frame_with(at, "quantity").set_index("quantity")["value"]
    n = len(event.lookup.ngram)
    said = summary["prompt lookup"]
    assert said.startswith(f"the last {n} token(s) '") and "λ first" in said and "ids" not in said


@pytest.mark.slow
def test_calibration_of_the_scores_over_the_run(tiny_dir, drafter_file):
    """The running metrics' calibration expander: the reliability diagram from the steps so far, its
    table per position (then per source), and as many samples as the pure view counts."""
    from ui.views import calibration

    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "top_k_candidates": "2",
                  "lookup_max_ngram": "2", "max_new": "12"})
    for _ in range(4):
        at.button(key="pg.step").click().run()
    ok(at)
    samples = calibration.samples(run_state(at).events)
    assert len(samples) > 0
    assert any(f"Calibration of ŝ ({len(samples)} nodes" in e.label for e in at.expander)
    fig = chart_titled(at, "Reliability of")
    assert fig["data"][0]["name"] == "perfectly calibrated"
    # issue 39: this chart's server-side SVG button raised a TypeError on every run; plotly.js saves it now
    assert exports(at)["dspark-reliability-position"] == "svg"
    assert int(frame_with(at, "mean ŝ")["samples"].sum()) == len(samples)
    radio = next(r for r in at.radio if r.label == "Group by")
    radio.set_value("source").run()
    ok(at)
    assert set(frame_with(at, "mean ŝ")["source"]) == set(samples["source"])
    assert exports(at)["dspark-reliability-source"] == "svg"


def test_replay_of_a_dspark_trace_escapes_hostile_pieces(tiny_dir, drafter_file):
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "max_new": "6"})
    data = json.loads(trace_json(at))
    for step in data["steps"]:
        step["next_piece"] = "<script>alert(1)</script>"
        for column in step["lattice"]:
            for cell in column["cells"]:
                cell["piece"] = "<img src=x onerror=alert(2)>"
        for node in step["nodes"]:
            node["piece"] = "<img src=x onerror=alert(2)>"
    fresh = new_app()
    fresh.switch_page("app_pages/traces.py").run()
    fresh.file_uploader(key="tr.upload").set_value(("evil.json", json.dumps(data).encode(), "application/json")).run()
    fresh.slider(key="ds.replay_cursor").set_value(1).run()
    ok(fresh)
    html = html_of(fresh)
    assert "<script>" not in html and "<img" not in html and "&lt;img src=x" in html
    lattice = json.dumps(chart_titled(fresh, "lattice"))
    assert "<img" not in lattice and "&lt;img src=x onerror=alert(2)&gt;" in lattice


def test_replay_of_a_cost_aware_trace_shows_the_size_choice(tiny_dir, drafter_file, tmp_path):
    """A cost-aware trace from the engine (as from the CLI) replays with its cost table and size chart
    (the sidebar's own cost table is tested in test_app_options.py)."""
    from decoding.core.trace import to_json
    from decoding.runner import run
    from decoding.runtime.cost_table import CostTable
    from decoding.runtime.models import ModelSpec, load

    table = tmp_path / "cost.json"
    CostTable(verify_ms=tuple(5.0 * n for n in range(1, 10)), source="test").save(table)
    lm = load(ModelSpec(name=str(tiny_dir)))
    trace = run(lm, lm.encode("Hello"), chain_config(max_new_tokens=6, gamma=4, cost_table=str(table),
                                                    drafter=drafter_file))
    event = trace.steps[1]
    assert trace.error is None and event.size is not None
    at = new_app()
    at.switch_page("app_pages/traces.py").run()
    at.file_uploader(key="tr.upload").set_value(("c.json", to_json(trace).encode(), "application/json")).run()
    at.slider(key="ds.replay_cursor").set_value(1).run()
    ok(at)
    size = chart_titled(at, "Cost-aware size")
    assert size["data"][0]["y"] == pytest.approx(list(event.size.tokens_per_s))
    assert f"chain length {event.size.size}" in json.dumps(size["layout"]["title"])
    assert any(t.value == f"Cost table: {Path(table).name}" for t in at.text)       # the name, not the server path
    assert not any(str(Path(table).parent) in t.value for t in at.text)
    sizes = frame_with(at, "tokens verified")["size (chain length or tree nodes)"]
    assert list(sizes) == list(range(1, len(event.size.tokens_per_s) + 1))


def _compare(at, strategies: list[str], drafter_file: str):
    at.switch_page("app_pages/compare.py").run()
    at.number_input(key="cmp.lanes").set_value(len(strategies)).run()
    for i, name in enumerate(strategies):
        at.selectbox(key=f"cmp{i}.strategy").set_value(name).run()
        if name == "dspark":
            at.text_input(key=f"cmp{i}.param.dspark.drafter").set_value(drafter_file).run()
            at.number_input(key=f"cmp{i}.param.dspark.gamma").set_value(3).run()
    at.button(key="cmp.run").click().run()
    ok(at)
    assert not at.error
    return at.session_state["ds.compare"]


@pytest.mark.slow
def test_compare_speedup_vs_greedy_and_dspark_charts(tiny_dir, drafter_file):
    at = new_app({"max_new": "8"})
    traces = _compare(at, ["greedy", "dspark", "sample"], drafter_file)
    table = frame_with(at, "speed vs greedy (×)").set_index("lane")
    assert table.loc["1: greedy", "speed vs greedy (×)"] == pytest.approx(1.0)

    def rate(trace):
        return len(trace.output_ids) / (sum(sum(e.timings_ms.values()) for e in trace.steps) / 1000)

    ratio = rate(traces["2: dspark"]) / rate(traces["1: greedy"])
    assert table.loc["2: dspark", "speed vs greedy (×)"] == pytest.approx(ratio)
    tau = table.loc["2: dspark", "τ (tokens per verification)"]
    assert tau == pytest.approx(traces["2: dspark"].stats.mean_accepted_length)
    assert any("relative to lane 1: greedy" in c.value for c in at.caption)
    per_forward = chart_titled(at, "Tokens per target forward")["data"][0]
    dspark = traces["2: dspark"]
    assert per_forward["y"][1] == pytest.approx(len(dspark.output_ids) / dspark.stats.target_forwards)
    per_position = chart_titled(at, "Per-position acceptance")
    assert [t["name"] for t in per_position["data"]] == ["2: dspark"]
    assert per_position["data"][0]["y"] == pytest.approx(list(traces["2: dspark"].stats.per_position_acceptance))
    streams = [h.value for h in at.html if 'class="ds-chips"' in h.value and "data-step" in h.value]
    assert traces["2: dspark"].output_ids == traces["1: greedy"].output_ids and 'class="ds-diverge"' not in streams[1]
    assert traces["3: sample"].output_ids != traces["1: greedy"].output_ids
    assert 'class="ds-diverge"' in streams[2]                                 # the first divergence stays marked


def test_compare_without_a_greedy_lane_says_so(tiny_dir, drafter_file):
    at = new_app({"max_new": "5"})
    _compare(at, ["sample", "dspark"], drafter_file)
    assert frame_with(at, "speed vs greedy (×)")["speed vs greedy (×)"].isna().all()
    assert any("no greedy lane" in c.value for c in at.caption)
