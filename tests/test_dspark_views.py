"""Pure helpers of the DSpark views (ui/views/dspark.py) and the compare page's new columns and charts, on
traces of real dspark runs with a tiny llama and a random drafter: every number is checked against
the trace (or recomputed from it by hand), each rule with a negative control that must fail it."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from dspark_helpers import chain_config, one_thread, random_drafter

from decoding.core.config import GreedyConfig, SampleConfig
from decoding.runner import run
from decoding.runtime.cost_table import CostTable
from ui.views import dspark, figures, tables
from ui.views.chips import chips_html, visible
from ui.views.figures import plot_text

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
PROMPT = [1, 2, 3, 4, 5]
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def drafter(lm):
    return random_drafter(lm, gamma_max=16)


@pytest.fixture(scope="module")
def chain_trace(lm, drafter):
    return run(lm, PROMPT, chain_config(max_new_tokens=40, gamma=4, top_k_candidates=3), drafter=drafter)


@pytest.fixture(scope="module")
def tree_trace(lm, drafter):
    return run(lm, PROMPT, chain_config(max_new_tokens=40, gamma=4, top_k_candidates=4, select="tree", budget=10,
                                        temperature=0.8, seed=2), drafter=drafter)


@pytest.fixture(scope="module")
def cost_trace(lm, drafter, tmp_path_factory):
    path = tmp_path_factory.mktemp("cost") / "cost.json"
    CostTable(verify_ms=tuple(10.0 + 2.0 * n for n in range(1, 18)), source="test", overhead_ms=3.0).save(path)
    return run(lm, PROMPT, chain_config(max_new_tokens=20, gamma=6, top_k_candidates=2, cost_table=str(path)),
               drafter=drafter)


def rounds_of(trace):
    return [e for e in trace.steps if not e.prefill and e.lattice]


# ------------------------------------------------------------------ lattice heatmap

def test_lattice_grid_shows_the_score_given_the_chosen_parent(chain_trace):
    checked_parent_dependence = False
    for event in rounds_of(chain_trace):
        grid = dspark.lattice_grid(event, "score")
        q = dspark.lattice_grid(event, "q_draft")
        path = event.dp.path
        for k, column in enumerate(event.lattice, start=1):
            for c in column.cells:
                parent = 0 if k == 1 else path[k - 2]
                assert grid["z"][c.cand][k - 1] == c.scores[parent]
                assert q["z"][c.cand][k - 1] == c.q_draft
                assert grid["text"][c.cand][k - 1] == plot_text(repr(visible(c.piece)))
                # negative control: the largest ŝ over parents is another number somewhere
                checked_parent_dependence |= max(c.scores) != c.scores[parent]
    assert checked_parent_dependence


def test_tree_reference_parents_follow_the_principal_branch(tree_trace):
    event = max(rounds_of(tree_trace), key=lambda e: max(n.depth for n in e.nodes))
    refs = dspark.reference_parents(event)
    node, expected = 0, [0]
    for _ in range(1, len(event.lattice)):
        kids = [n for n in event.nodes if n.parent == node]
        if not kids:
            break
        best = max(kids, key=lambda n: n.survival)
        expected.append(best.cand)
        node = best.node
    expected += [None] * (len(event.lattice) - len(expected))
    assert refs == expected and refs[0] == 0


def test_lattice_figure_draws_every_node_with_its_verdict(tree_trace):
    event = next(e for e in rounds_of(tree_trace) if e.accepted_path and len(e.accepted_path) >= 1
                 and any(n.verdict == "rejected" for n in e.nodes))
    fig = dspark.lattice_figure(event)
    heat = fig.data[0]
    assert heat.type == "heatmap" and (heat.zmin, heat.zmax) == (0, 1)
    markers = {t.name: t for t in fig.data if t.type == "scatter" and t.mode == "markers"}
    symbols = set()
    for verdict, (color, symbol, label) in dspark.NODE_STYLE.items():
        nodes = [n for n in event.nodes if n.verdict == verdict]
        if not nodes:
            assert label not in markers
            continue
        trace = markers[label]
        assert len(trace.x) == len(nodes) and trace.marker.symbol == symbol and trace.marker.color == color
        assert sorted(x + dspark.MARK_SHIFT for x in trace.x) == pytest.approx(sorted(n.depth for n in nodes))
        assert all(abs(y - (n.cand + 1)) <= 0.25 for y, n in zip(trace.y, nodes))     # candidates drawn from 1
        symbols.add(symbol)
    assert len(symbols) >= 2                                   # shape twins differ, not just colours
    pieces = next(t for t in fig.data if t.name == "pieces")
    assert len(pieces.text) == sum(len(col.cells) for col in event.lattice)


def test_edges_split_the_accepted_path_from_the_rest(tree_trace):
    for event in rounds_of(tree_trace):
        on, off = dspark._edges(event)
        assert len(on) + len(off) == len(event.nodes)                  # one edge into every node
        assert len(on) == len(event.accepted_path)                      # root -> a1 -> a2 ...
        if event.accepted_path:
            first = next(n for n in event.nodes if n.node == event.accepted_path[0])
            assert on[0][0] == (dspark.ROOT_X, 1) and on[0][1][0] == first.depth - dspark.MARK_SHIFT
    # negative control: the plan edges are not all on the accepted path
    assert any(dspark._edges(e)[1] for e in rounds_of(tree_trace))


def test_hostile_pieces_are_escaped_in_the_figure(chain_trace):
    event = rounds_of(chain_trace)[0]
    cells = tuple(dataclasses.replace(col, cells=tuple(dataclasses.replace(c, piece=HOSTILE) for c in col.cells))
                  for col in event.lattice)
    nodes = tuple(dataclasses.replace(n, piece=HOSTILE) for n in event.nodes)
    evil = dataclasses.replace(event, lattice=cells, nodes=nodes, next_piece=HOSTILE)
    fig = dspark.lattice_figure(evil)
    dumped = fig.to_json()
    assert "<script>" not in dumped and "&lt;script&gt;" in dumped
    chips = chips_html(dspark.dspark_chips(evil))
    assert "<script>" not in chips and "&lt;script&gt;" in chips


# ------------------------------------------------------------------ stage 1

def test_dp_table_is_the_recorded_recursion(chain_trace):
    for event in rounds_of(chain_trace):
        table = dspark.dp_table(event)
        length = len(event.dp.path)
        assert table["on_path"].sum() == length
        assert list(table[table["on_path"]]["cand"]) == [j + 1 for j in event.dp.path]   # shown from 1
        rows = table.to_dict("records")
        for row in rows:
            nxt = [r for r in rows if r["k"] == row["k"] + 1 and r["parent"] == row["cand"]]
            tail = max((r["V"] for r in nxt), default=0.0)
            assert row["V"] == pytest.approx(row["score"] * (1 + tail))
            # negative control: the recursion without the "1 +" (this position's own token) is wrong
            assert row["V"] != pytest.approx(row["score"] * tail)
            if nxt:
                assert row["back"] == max(nxt, key=lambda r: r["V"])["cand"]
        first = [r for r in rows if r["k"] == 1 and r["on_path"]]
        assert first[0]["V"] == pytest.approx(event.expected_accepted)


def test_dp_table_is_empty_in_tree_mode(tree_trace):
    event = rounds_of(tree_trace)[0]
    assert event.dp is None and dspark.dp_table(event).empty


def test_selection_summary(chain_trace, tree_trace):
    event = rounds_of(chain_trace)[0]
    s = dspark.selection_summary(event)
    assert s["mode"] == "chain (DP)" and s["positions drafted (γ)"] == 4 and s["candidates per position (K)"] == 3
    assert s["chain length verified"] == len(event.nodes) == 4
    assert s["expected tokens this forward"] == pytest.approx(1 + event.expected_accepted, abs=1e-4)
    assert s["size"].startswith("fixed") and s["acceptance"] == "exact"
    tree = rounds_of(tree_trace)[0]
    assert dspark.selection_summary(tree)["tree nodes verified"] == len(tree.nodes) == 10
    assert list(dspark.summary_table(event)["quantity"]) == list(s)
    assert s["prompt lookup"] == "off"


def test_a_round_without_drafts_does_not_call_lookup_off(lm, drafter):
    """The last round of a run has no room to draft: lookup was on but not used, and says so."""
    trace = run(lm, PROMPT, chain_config(max_new_tokens=7, gamma=5, lookup_max_ngram=2), drafter=drafter)
    rounds = [e for e in trace.steps if not e.prefill]
    bare = [e for e in rounds if not e.lattice]
    assert bare, "the run should end on a round with no room to draft"
    assert dspark.selection_summary(bare[-1])["prompt lookup"] == "not used (no drafts this round)"
    drafted = [e for e in rounds if e.lattice]
    assert drafted and all(dspark.selection_summary(e)["prompt lookup"] != "off" for e in drafted)


def test_size_table_recomputes_the_recorded_rates(cost_trace):
    event = next(e for e in rounds_of(cost_trace) if e.size is not None)
    info = event.size
    table = dspark.size_table(info)
    assert list(table["size"]) == list(range(1, len(info.tokens_per_s) + 1))
    assert table["chosen"].sum() == 1 and int(table.loc[table["chosen"], "size"].iloc[0]) == info.size
    assert int(table.loc[table["tokens_per_s"].idxmax(), "size"]) == info.size
    for _, row in table.iterrows():
        size = int(row["size"])
        assert row["verify_ms"] == 10.0 + 2.0 * (size + 1)           # the table's entry for size + 1 tokens
        assert row["round_ms"] == row["verify_ms"] + info.overhead_ms
        assert row["tokens_per_s"] == pytest.approx(1000 * (1 + row["expected_accepted"]) / row["round_ms"])
        # negative controls: pricing `size` tokens (forgetting the last emitted token), or no overhead
        assert row["tokens_per_s"] != pytest.approx(1000 * (1 + row["expected_accepted"]) /
                                                    (info.verify_ms[size - 1] + info.overhead_ms))
        assert row["tokens_per_s"] != pytest.approx(1000 * (1 + row["expected_accepted"]) / row["verify_ms"])
    assert len(dspark.cost_table(info)) == len(info.verify_ms)
    fig = dspark.size_figure(info, event.select)
    colors = list(fig.data[0].marker.color)
    assert colors.count(dspark.palette.GREEN) == 1 and colors.index(dspark.palette.GREEN) == info.size - 1
    assert list(fig.data[0].marker.pattern.shape).index("/") == info.size - 1      # the shape twin
    assert f"chain length {info.size}" in fig.layout.title.text and "+ 3.0 ms overhead" in fig.layout.title.text


# ------------------------------------------------------------------ stage 2, chips, rows

def test_verdicts_table_lists_every_node_then_the_next_token(tree_trace):
    for event in rounds_of(tree_trace):
        table = dspark.verdicts_table(event)
        assert len(table) == len(event.nodes) + 1
        body, last = table.iloc[:-1], table.iloc[-1]
        assert list(body["verdict"]) == [n.verdict for n in event.nodes]
        assert list(body["p_target"]) == [n.p_target for n in event.nodes]
        draws = [None if isinstance(u, float) and math.isnan(u) else u for u in body["u"]]
        assert draws == [n.draw for n in event.nodes]
        assert list(body["q_draft"]) == [event.lattice[n.depth - 1].cells[n.cand].q_draft for n in event.nodes]
        assert last["token_id"] == event.next_token and last["verdict"] == f"next: {event.next_from}"
        assert last["u"] == event.next_draw
    verdicts = {v for e in rounds_of(tree_trace) for v in dspark.verdicts_table(e)["verdict"]}
    assert {"accepted", "rejected", "next: residual"} <= verdicts


@pytest.mark.parametrize("name", ["chain_trace", "tree_trace"])
def test_chips_rebuild_the_output(name, request, lm):
    trace = request.getfixturevalue(name)
    chips = [c for e in trace.steps for c in dspark.dspark_chips(e)]
    emitted = [c for c in chips if c.emitted]
    assert [c.piece for c in emitted] == [lm.piece(t) for t in trace.output_ids]
    rounds = rounds_of(trace)
    assert sum(c.origin == "accepted" for c in chips) == sum(len(e.accepted_path) for e in rounds)
    assert sum(c.origin == "rejected" for c in chips) == sum(n.verdict == "rejected" for e in rounds for n in e.nodes)
    assert not any(c.emitted for c in chips if c.origin == "rejected")
    # negative control: counting the rejected chips as output would not rebuild it
    assert len(chips) != len(trace.output_ids)
    html_out = chips_html(chips)
    assert html_out.count("ds-origin-accepted") == sum(len(e.accepted_path) for e in rounds)


def test_chip_origins_of_the_next_token(tree_trace, chain_trace):
    origins = {e.next_from: dspark.dspark_chips(e)[-1].origin for t in (tree_trace, chain_trace) for e in t.steps
               if e.next_token in e.emitted}
    assert origins == {"prefill": "target", "residual": "residual", "argmax": "residual", "bonus": "bonus"}


def test_chips_are_cut_where_the_emitted_tokens_end(chain_trace):
    event = next(e for e in rounds_of(chain_trace) if e.accepted_path)
    cut = dataclasses.replace(event, emitted=event.emitted[:1])
    chips = dspark.dspark_chips(cut)
    assert [c.origin for c in chips if c.emitted] == ["accepted"]
    whole = dspark.dspark_chips(event)
    assert sum(c.emitted for c in whole) == len(event.emitted) > 1


def test_step_rows(chain_trace):
    table = pd.DataFrame([dspark.dspark_row(e) for e in chain_trace.steps])
    assert list(table["accepted"]) == [len(e.accepted_path) for e in chain_trace.steps]
    assert list(table["next_from"])[0] == "prefill" and bool(table["prefill"].iloc[0])


def test_running_metrics_and_phase_breakdown(tree_trace):
    m = dspark.dspark_metrics(tree_trace.steps)
    assert m["tau"] == pytest.approx(tree_trace.stats.mean_accepted_length)
    assert m["acceptance_rate"] == pytest.approx(tree_trace.stats.acceptance_rate)
    assert m["per_position"] == pytest.approx(tree_trace.stats.per_position_acceptance)
    assert m["rounds"] == len(tree_trace.steps) - 1
    phases = dspark.phase_table(tree_trace.steps)
    assert list(phases["phase"])[:5] == list(dspark.PHASES)
    rounds = dspark.drafting_rounds(tree_trace.steps)
    assert phases["ms"].sum() == pytest.approx(sum(sum(e.timings_ms.values()) for e in rounds))
    assert phases["share"].sum() == pytest.approx(1.0)
    drafter_ms = sum(e.timings_ms.get("drafter", 0.0) for e in rounds)
    assert phases.loc[phases["phase"] == "drafter", "ms"].iloc[0] == pytest.approx(drafter_ms)
    fig = dspark.phase_bars(phases)
    assert list(fig.data[0].x) == list(phases["share"])
    assert list(fig.data[0].y)[:2] == ["drafting", "DP selection"]                # the phases in words


# ------------------------------------------------------------------ compare page

def test_speedup_is_relative_to_the_first_greedy_lane(lm, drafter, chain_trace):
    greedy = run(lm, PROMPT, GreedyConfig(max_new_tokens=40))
    sample = run(lm, PROMPT, SampleConfig(max_new_tokens=40, seed=1))
    traces = {"1: sample": sample, "2: greedy": greedy, "3: dspark": chain_trace}
    assert tables.greedy_lane(traces) == "2: greedy"
    table = tables.metrics_table(traces).set_index("lane")

    def rate(trace):
        ms = sum(sum(e.timings_ms.values()) for e in trace.steps)
        return len(trace.output_ids) / (ms / 1000)

    assert table.loc["2: greedy", "speedup_vs_greedy"] == pytest.approx(1.0)
    for label, trace in traces.items():
        assert table.loc[label, "step_tokens_per_s"] == pytest.approx(rate(trace))
        assert table.loc[label, "speedup_vs_greedy"] == pytest.approx(rate(trace) / rate(greedy))
    # negative control: against the first lane (sampling) the dspark lane's number differs
    assert table.loc["3: dspark", "speedup_vs_greedy"] != pytest.approx(rate(chain_trace) / rate(sample))
    assert table.loc["3: dspark", "tau"] == pytest.approx(chain_trace.stats.mean_accepted_length)


def test_no_greedy_lane_leaves_the_speedup_empty(lm, chain_trace, tree_trace):
    traces = {"1: dspark": chain_trace, "2: dspark tree": tree_trace}
    assert tables.greedy_lane(traces) is None
    assert tables.metrics_table(traces)["speedup_vs_greedy"].isna().all()


def test_tokens_per_forward_and_per_position_charts(chain_trace, tree_trace):
    fig = figures.tokens_per_forward_bars([("1: greedy", 1.0), ("2: <b>x</b>", 1.5)])
    assert list(fig.data[0].y) == [1.0, 1.5] and list(fig.data[0].x) == ["1: greedy", "2: &lt;b&gt;x&lt;/b&gt;"]
    assert len(set(fig.data[0].marker.pattern.shape)) == 2
    lanes = {"1: greedy": None, "2: dspark": chain_trace.stats.per_position_acceptance,
             "3: tree": tree_trace.stats.per_position_acceptance}
    fig = figures.per_position_lanes(lanes)
    assert [t.name for t in fig.data] == ["2: dspark", "3: tree"]
    assert list(fig.data[1].y) == list(tree_trace.stats.per_position_acceptance)
    assert fig.data[0].marker.color == figures.palette.LANE_COLORS[1]     # the lane keeps its colour


def test_cost_tables_are_named_without_the_servers_path():
    from ui.views.tables import table_name

    assert table_name("auto: default-cpu-float32.json") == "auto, profiled on this machine"
    assert table_name("/root/.cache/decodescope/cost/default-cpu-float32.json") == \
        "auto, profiled on this machine"                                            # as older traces stored it
    assert table_name("/home/me/tables/mine.json") == "mine.json"
    assert table_name("mine.json") == "mine.json"
    from ui.views.tables import table_short

    assert table_short("auto: default-cpu-float32.json") == "auto"
    assert table_short("/root/.cache/decodescope/cost/default-cpu-float32.json") == "auto"
    assert table_short("/home/me/tables/mine.json") == "mine.json"


def test_the_summary_names_the_cost_table_in_a_few_words(cost_trace):
    """The stage-1 summary's size cell fits its column: the size and "auto" or the table's file name."""
    sized = [e for e in cost_trace.steps if getattr(e, "size", None)]
    assert sized, "the fixture should have cost-aware rounds"
    for event in sized:
        size = dspark.selection_summary(event)["size"]
        assert size == f"cost-aware: {event.size.size} (cost table cost.json)", size
