"""The Requests page's pure views: percentiles (checked against numpy's, with a shifted set as negative
control), histograms on bins shared by the strategies, acceptance counted as vLLM counts it, the requests
table, hostile records refused in one line naming the field, and engines' telemetry read."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from requests_support import record, served

from ui.views import engine_metrics
from ui.views import requests as rq

DATA = Path(__file__).resolve().parent / "data"


def cell(table, strategy: str, measure: str, column: str) -> str:
    return table[(table["Strategy"] == strategy) & (table["Measure"] == measure)][column].item()


def test_percentiles_are_numpys_linear_ones_per_strategy():
    e2e = [0.1, 0.2, 0.3, 0.4, 1.5]
    rows = [served("greedy", v) for v in e2e] + [served("dspark", v / 2) for v in e2e]
    table = rq.percentile_table(rows)
    for q in rq.PERCENTILES:
        assert cell(table, "greedy", "End to end", f"P{q} (ms)") == f"{np.percentile(e2e, q) * 1000:,.1f}"
        assert cell(table, "dspark", "End to end", f"P{q} (ms)") == f"{np.percentile(e2e, q) * 500:,.1f}"
    shifted = rq.percentile_table([served("greedy", v + 0.001) for v in e2e])        # negative control
    assert cell(shifted, "greedy", "End to end", "P50 (ms)") != cell(table, "greedy", "End to end", "P50 (ms)")


def test_inter_token_latency_pools_every_gap_and_a_missing_first_token_is_a_dash():
    rows = [served("greedy", 1.0, gaps=(0.01, 0.02, 0.03), ttft=None)]
    table = rq.percentile_table(rows)
    assert cell(table, "greedy", "Inter-token latency", "Values") == 3
    assert cell(table, "greedy", "Inter-token latency", "P50 (ms)") == "20.0"
    assert cell(table, "greedy", "Time to first token", "P99 (ms)") == rq.NA
    assert "None" not in table.to_string() and "_s" not in " ".join(table.columns)


def test_histograms_share_their_bins_and_count_every_value():
    rows = [served("greedy", v) for v in (0.1, 0.2, 0.9)] + [served("dspark", v) for v in (0.05, 0.06)]
    fig = rq.latency_histogram(rows, "e2e_s", bins=5)
    by_name = {bar.name: bar for bar in fig.data}
    assert sum(by_name["greedy"].y) == 3 and sum(by_name["dspark"].y) == 2
    assert list(by_name["greedy"].x) == list(by_name["dspark"].x)          # the same bins
    own = np.histogram_bin_edges([0.05, 0.06], bins=5) * 1000              # negative control: its own bins
    assert not np.allclose((own[:-1] + own[1:]) / 2, by_name["dspark"].x)


def test_a_strategy_name_with_markup_is_escaped_in_the_chart():
    fig = rq.latency_histogram([served("<b>x</b>", 0.1)])
    assert fig.data[0].name == "&lt;b&gt;x&lt;/b&gt;" and "<b>" not in fig.data[0].hovertemplate


def test_acceptance_is_counted_as_vllm_counts_it():
    rounds = [(4, 0), (4, 2), (4, 4), (4, 2), (0, 0)]
    acc = rq.acceptance_of(rounds, "s")
    assert (acc.drafts, acc.draft_tokens, acc.accepted, acc.per_pos) == (4, 16, 8, (3, 3, 1, 1))
    direct = Counter(a for d, a in rounds if d)                             # an independent count
    assert rq.accepted_length_counts(acc) == [direct[k] for k in range(5)] == [1, 0, 2, 0, 1]
    assert rq.accepted_length_counts(rq.acceptance_of([(4, 1)], "s")) != [1, 0, 2, 0, 1]


def test_the_requests_table_is_slowest_first_in_words():
    rows = [served("greedy", 0.2, rounds=[(3, 1)]), served("greedy", 0.9, queue=0.7), served("dspark", 0.5)]
    table = rq.requests_table(rows)
    assert list(table["End to end (ms)"]) == [900.0, 500.0, 200.0]
    slow = table.iloc[0]
    assert slow["Queue (ms)"] == pytest.approx(700) and slow["Decoding (ms)"] == pytest.approx(200)
    assert slow["Accepted / drafted"] == rq.NA and table.iloc[2]["Accepted / drafted"] == "1 / 3"


def test_a_whole_record_is_read_with_its_traces_rounds():
    row = rq.parse_record(record(0, 1), "r.json")
    assert row.strategy == "speculative" and row.rounds and all(0 <= a <= d for d, a in row.rounds)
    assert rq.parse_record(record(0, 0), "g.json").rounds == ()


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.pop("timing"), "timing"),
    (lambda r: r["timing"].update(e2e_s=-1), "timing.e2e_s"),
    (lambda r: r["timing"].update(queue_s="1"), "timing.queue_s"),
    (lambda r: r["timing"].update(queue_s=True), "timing.queue_s"),
    (lambda r: r["timing"].update(itl_s={"a": 1}), "timing.itl_s"),
    (lambda r: r["timing"].update(itl_s=[float("nan")]), "timing.itl_s"),
    (lambda r: r.update(strategy=["x"]), "strategy"),
    (lambda r: r.update(id="x" * 500), "id"),
    (lambda r: r.update(rounds=[[1, 5]]), "rounds"),
])
def test_a_hostile_record_is_one_line_naming_the_field(mutate, field):
    data = record(1, 1)
    mutate(data)
    with pytest.raises(rq.RequestLogError) as caught:
        rq.parse_record(data, "bad.json")
    assert str(caught.value).startswith("bad.json: ") and field in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(rq.RequestLogError):
        rq.parse_record([data], "list.json")


def test_vllm_metrics_text_is_read_with_prometheus_clients_parser():
    acc = engine_metrics.read((DATA / "vllm-metrics.prom").read_bytes(), "m.prom")
    assert (acc.drafts, acc.draft_tokens, acc.accepted, acc.per_pos) == (10, 30, 16, (8, 5, 3))
    assert rq.accepted_length_counts(acc) == [2, 3, 2, 3]
    assert "acceptance rate 0.53" in rq.acceptance_line(acc) and "τ 2.60" in rq.acceptance_line(acc)


def test_sglang_and_llama_cpp_replies_are_read():
    sg = engine_metrics.read((DATA / "sglang-replies.json").read_bytes(), "s.json")
    assert (sg.drafts, sg.accepted, sg.draft_tokens) == (9, 12, 0) and "τ 2.33" in rq.acceptance_line(sg)
    assert "acceptance rate —" in rq.acceptance_line(sg)
    ll = engine_metrics.read((DATA / "llamacpp-replies.json").read_bytes(), "l.json")
    assert (ll.drafts, ll.draft_tokens, ll.accepted) == (0, 32, 14) and "acceptance rate 0.44" in rq.acceptance_line(ll)


@pytest.mark.parametrize("raw, words", [
    (b'{"choices": []}', "no metrics (vLLM), meta_info (SGLang) or timings (llama.cpp)"),
    (json.dumps([{"timings": {"draft_n": -1, "draft_n_accepted": 0}}]).encode(), "[0].timings.draft_n"),
    (json.dumps({"meta_info": {"spec_verify_ct": 2}}).encode(), "spec_accept_length"),
    (b"{not json", "not valid JSON"),
    (b"[" * 100000, "not valid JSON"),
    (b"some_metric 1\n", "no vllm:spec_decode_num_drafts_total counter"),
    (b"vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"x\"} 1\n", "position='x'"),
    (b"\xff\xfe", "not UTF-8"),
    (b"<html><script>alert(1)</script>", "not Prometheus text"),
])
def test_an_unknown_telemetry_shape_is_one_line_naming_the_file_and_field(raw, words):
    with pytest.raises(rq.RequestLogError) as caught:
        engine_metrics.read(raw, "t.txt")
    line = str(caught.value)
    assert line.startswith("t.txt: ") and words in line and "\n" not in line, line


def vllm_replies() -> list:
    return json.loads((DATA / "vllm-replies.json").read_text())


def test_vllm_per_request_spec_decode_metrics_are_read():
    """tests/data/vllm-replies.json is written by hand from vLLM's documented shape (docs/features/
    speculative_decoding/acceptance_metrics.md, 0.29 and later): a whole chat reply at `summary` and a streamed
    completion's last (usage) chunk at `detailed`. The counts are checked against sums made here from the
    replies' own histograms and per-step arrays."""
    replies = vllm_replies()
    acc = engine_metrics.read((DATA / "vllm-replies.json").read_bytes(), "v.json")
    specs = [r["metrics"]["speculative_decoding"] for r in replies]
    hist = [sum(s["acceptance_histogram"][j] for s in specs) for j in range(4)]
    assert rq.accepted_length_counts(acc) == hist == [3, 2, 1, 5]
    steps = Counter(specs[1]["per_step_accepted"])                            # the detailed one, counted here
    assert [steps[j] for j in range(4)] == specs[1]["acceptance_histogram"]
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (11, 29, 19)
    assert acc.per_pos == (8, 6, 5)                                          # rounds accepting at least k + 1
    line = rq.acceptance_line(acc)
    assert "τ 2.73" in line and "acceptance rate 0.66" in line and "1 detailed" in line, line
    one = engine_metrics.read(json.dumps(replies[0]).encode(), "one.json")    # one reply alone: its own numbers
    assert f"τ {specs[0]['mean_acceptance_length']:.2f}" in rq.acceptance_line(one)


def _spoiled(path: list, value) -> bytes:
    replies = vllm_replies()
    spec = replies[1]["metrics"]
    for key in path[:-1]:
        spec = spec[key]
    if value is KeyError:
        del spec[path[-1]]
    else:
        spec[path[-1]] = value
    return json.dumps(replies).encode()


@pytest.mark.parametrize("path, value, field", [
    (["speculative_decoding"], None, "[1].metrics.speculative_decoding is null"),
    (["speculative_decoding"], [1], "[1].metrics.speculative_decoding='[1]' is not an object"),
    (["speculative_decoding"], KeyError, "[1].metrics.speculative_decoding is missing"),
    (["speculative_decoding", "acceptance_histogram"], [1, 1, 1, 2, 0], "acceptance_histogram has 5 counts"),
    (["speculative_decoding", "acceptance_histogram"], {"0": 1}, "acceptance_histogram="),
    (["speculative_decoding", "num_spec_steps"], 6, "num_spec_steps=6 is not the histogram's sum"),
    (["speculative_decoding", "num_accepted_draft_tokens"], "9", "num_accepted_draft_tokens='9'"),
    (["speculative_decoding", "num_draft_tokens"], 16, "num_draft_tokens=16 is not between"),
    (["speculative_decoding", "mean_acceptance_length"], 1.8, "mean_acceptance_length=1.8 is not 2.8"),
    (["speculative_decoding", "draft_acceptance_rate"], None, "draft_acceptance_rate=None"),
    (["speculative_decoding", "per_step_drafted"], [3, 1, 2, 3], "have 5 and 4 steps"),
    (["speculative_decoding", "per_step_drafted"], [3, 1, 0, 3, 2], "per_step_accepted[2]=1 is more than"),
    (["speculative_decoding", "per_step_accepted"], [2, 0, 1, 3, 2], "does not add up to acceptance_histogram"),
    (["speculative_decoding", "num_spec_tokens"], float("inf"), "num_spec_tokens='inf' is not a count"),
])
def test_a_malformed_vllm_reply_is_one_line_naming_the_file_and_field(path, value, field):
    """Negative controls for the reader above: each reply spoiled in one field of vLLM's shape."""
    with pytest.raises(rq.RequestLogError) as caught:
        engine_metrics.read(_spoiled(path, value), "v.json")
    line = str(caught.value)
    assert line.startswith("v.json: ") and field in line and "\n" not in line, line


def test_the_charts_take_the_projects_palette_and_each_strategy_its_own_pattern():
    """Not plotly's default colours: each strategy's bars a distinct Okabe-Ito colour (ui/views/palette.py) and a
    distinct pattern; the acceptance charts too."""
    from ui.views import palette

    okabe_ito = {palette.BLUE, palette.ORANGE, palette.GREEN, palette.VERMILLION, palette.PURPLE, palette.SKY,
                 palette.YELLOW, palette.BLACK}
    rows = [served(s, v) for s in ("greedy", "speculative", "dspark") for v in (0.1, 0.2)]
    bars = rq.latency_histogram(rows).data
    colors, patterns = [b.marker.color for b in bars], [b.marker.pattern.shape for b in bars]
    assert len(set(colors)) == len(set(patterns)) == 3 and set(colors) <= okabe_ito, (colors, patterns)
    acc = rq.acceptance_figure(rq.acceptance_of([(3, 1), (3, 3)], "s")).data
    assert {b.marker.color for b in acc} <= okabe_ito and all(b.marker.color for b in acc)
