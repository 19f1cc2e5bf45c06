"""Pure UI helpers: figures, tables, chips, parameters and the step-through run, without streamlit.

Figure maths is checked against exact full-vocabulary values computed here from the logits (the
trace itself only holds the top-N), each with a negative control that must fail the same check."""
from __future__ import annotations

import math

import pytest
import torch

from decoding.core.config import GreedyConfig, SampleConfig
from decoding.core.errors import ConfigError
from decoding.core.processors import apply_tracked, build_pipeline
from decoding.core.token_step import Choice, Scored, sample_inverse_cdf, token_step
from decoding.core.trace import TokenStep, without_timings
from decoding.runner import run
from ui.views import figures, tables
from ui.views.chips import (
    Chip,
    chip_html,
    chips_for,
    chips_html,
    first_divergence,
    last_chips,
    legend_html,
    token_box_html,
)
from ui.widgets.live import LiveRun
from ui.widgets.params import Settings, build_config, from_query, param_fields, to_query

V = 64


def make_step(tiny_lm, *, seed=0, temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, top_n=12, generator_seed=1):
    """A TokenStep from random logits through the engine's own step builder, plus its logits."""
    raw = torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 2.5  # (V,)
    pipeline = build_pipeline(temperature, top_k, top_p, min_p)
    applied = apply_tracked(pipeline, raw)
    token, draw = sample_inverse_cdf(applied.logits.softmax(-1), torch.Generator().manual_seed(generator_seed))
    step = token_step(tiny_lm, index=0, position=5, scored=Scored(raw, pipeline, applied),
                      choice=Choice(token, draw), top_n=top_n)
    return step, raw, applied


def close(xs, ys, tol=1e-5) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and abs(x - y) <= tol)
               for x, y in zip(xs, ys, strict=True))


# ------------------------------------------------------------------ figure maths

@pytest.mark.parametrize("kwargs", [{"temperature": 0.7, "top_k": 20, "top_p": 0.8},
                                    {"temperature": 1.6, "top_p": 0.6, "min_p": 0.05},
                                    {"temperature": 1.0, "min_p": 0.2}])
def test_scaled_and_processed_probs_match_full_vocab(tiny_lm, kwargs):
    step, raw, applied = make_step(tiny_lm, **kwargs)
    ids = [c.token_id for c in step.raw_top]
    t = kwargs["temperature"]
    truth_scaled = (raw / t).softmax(-1)[ids].tolist()
    assert close(figures.scaled_probs(step), truth_scaled)
    kept = applied.removed_by == 0
    truth_space = ((raw / t) - (raw / t)[kept].logsumexp(-1)).exp()[ids].tolist()   # as if kept
    assert close(figures.processed_space(step), truth_space)
    wrong = raw.softmax(-1)[ids].tolist()                  # negative control: forgetting the temperature
    assert t == 1.0 or not close(wrong, truth_scaled)


def test_top_p_cumulative_matches_the_distribution_top_p_saw(tiny_lm):
    step, raw, applied = make_step(tiny_lm, temperature=0.8, top_k=6, top_p=0.7, top_n=10)
    scaled = raw / 0.8
    after_k = scaled.masked_fill(scaled < torch.topk(scaled, 6).values[-1], -math.inf).softmax(-1)  # (V,)
    truth, total = [], 0.0
    for c in step.processed_top:
        if c.removed_by == "top_k":
            truth.append(None)
        else:
            total += float(after_k[c.token_id])
            truth.append(total)
    assert close(figures.top_p_cumulative(step), truth)
    assert truth[5] is not None and truth[6] is None      # top-k's cut shows as a gap
    wrong, total = [], 0.0                                  # negative control: cumulating the raw p
    for c, r in zip(step.processed_top, step.raw_top):
        total += r.prob
        wrong.append(None if c.removed_by == "top_k" else total)
    assert not close(wrong, truth)


def test_probability_bars_traces_and_lines(tiny_lm):
    step, _, _ = make_step(tiny_lm, temperature=0.9, top_k=8, top_p=0.9, min_p=0.1, top_n=15)
    fig = figures.probability_bars(step)
    names = [t.name for t in fig.data]
    assert names[:2] == ["p raw (T=1, no filters)", "p processed (sampled from)"]
    assert "removed by top-k ✂" in names and "top-p: cumulative p (right axis)" in names
    removed_k = next(t for t in fig.data if t.name == "removed by top-k ✂")
    assert sum(y is not None for y in removed_k.y) == sum(c.removed_by == "top_k" for c in step.processed_top)
    assert removed_k.marker.pattern.shape == "x"          # the shape twin of the colour
    processed = fig.data[1]
    assert [y is None for y in processed.y] == [c.removed_by is not None for c in step.processed_top]
    assert len(fig.data[0].x) == 15
    lines = {s.y0 for s in fig.layout.shapes}
    floor = 0.1 * max(figures.processed_space(step))
    assert any(abs(y - 0.9) < 1e-12 for y in lines) and any(abs(y - floor) < 1e-12 for y in lines)


def test_greedy_bars_have_no_filter_marks(tiny_lm):
    raw = torch.randn(V, generator=torch.Generator().manual_seed(3))
    pipeline = build_pipeline()
    applied = apply_tracked(pipeline, raw)
    step = token_step(tiny_lm, index=0, position=1, scored=Scored(raw, pipeline, applied),
                      choice=Choice(int(raw.argmax())), top_n=5)
    fig = figures.probability_bars(step)
    assert [t.name for t in fig.data] == ["p raw (T=1, no filters)", "p processed (sampled from)"]
    assert figures.draw_cdf(step) is None


def _chosen_interval(fig, step):
    bars = fig.data[0]
    i = [x.split(":")[0] for x in bars.x].index(str(step.chosen_id))
    return bars.base[i], bars.base[i] + bars.y[i]


def test_draw_cdf_puts_u_in_the_chosen_tokens_interval(tiny_lm):
    wrong_hits = 0
    for seed in range(12):
        step, _, _ = make_step(tiny_lm, seed=seed, temperature=1.3, top_k=8, top_n=10, generator_seed=seed)
        fig = figures.draw_cdf(step)
        assert fig is not None and figures.kept_coverage(step) == pytest.approx(1.0, abs=1e-5)
        low, high = _chosen_interval(fig, step)
        assert low <= step.draw < high + 1e-9
        # negative control: the same intervals laid out by probability instead of vocabulary order
        kept = sorted((c for c in step.processed_top if c.removed_by is None), key=lambda c: -c.prob)
        acc = 0.0
        for c in kept:
            if c.token_id == step.chosen_id:
                wrong_hits += acc <= step.draw < acc + c.prob
            acc += c.prob
    assert wrong_hits < 12


def test_draw_cdf_refuses_when_candidates_miss_kept_mass(tiny_lm):
    step, _, _ = make_step(tiny_lm, temperature=1.0, top_n=5)
    assert figures.kept_coverage(step) < 0.99 and figures.draw_cdf(step) is None


def test_timing_waterfall_stacks_phases():
    fig = figures.timing_waterfall({"prefill": 40.0, "processing": 2.5, "sampling": 0.5, "other": 1.0})
    bar = fig.data[0]
    assert list(bar.y) == ["prefill (the prompt)", "logit processing", "sampling", "other (Python, bookkeeping)"]
    assert list(figures.timing_waterfall({"phase x": 1.0}).data[0].y) == ["phase x"]    # a name without words
    assert list(bar.base) == [0.0, 40.0, 42.5, 43.0] and list(bar.x) == [40.0, 2.5, 0.5, 1.0]
    assert "total 44.0 ms" in fig.layout.title.text


def test_fixed_margins_leave_room_for_the_labels_and_turn_automargin_off(tiny_lm):
    short = figures.fixed_margins(figures.timing_waterfall({"a": 1.0, "b": 2.0}))
    long_name = "verification (target forward over the chain)"
    wide = figures.fixed_margins(figures.timing_waterfall({"a": 1.0, long_name: 2.0}))
    assert wide.layout.margin.l >= len(long_name) * figures.CHAR_PX > short.layout.margin.l
    assert wide.layout.margin.t == 50                       # the title's room is kept
    for fig in (short, wide):
        assert fig.layout.xaxis.automargin is False and fig.layout.yaxis.automargin is False
    # category labels on x that may be turned by 30°: room below them grows with the longest label
    few = figures.fixed_margins(figures.tokens_per_forward_bars([("greedy", 1.0), ("lookup", 2.0)]))
    many = figures.fixed_margins(figures.tokens_per_forward_bars([(f"lane {i}: " + "x" * 30, 1.0) for i in range(12)]))
    assert many.layout.margin.b > few.layout.margin.b + 40
    # a right axis (top-p's cumulative line) gets its own margin; without one the right margin stays
    step, _, _ = make_step(tiny_lm, top_p=0.8)
    bars = figures.fixed_margins(figures.probability_bars(step))
    assert bars.layout.yaxis2.automargin is False and bars.layout.margin.r > 40
    plain, _, _ = make_step(tiny_lm)
    assert figures.fixed_margins(figures.probability_bars(plain)).layout.margin.r == 10


def test_tokens_vs_time_one_line_per_lane(tiny_lm):
    a = run(tiny_lm, [1, 2, 3], GreedyConfig(max_new_tokens=5)).steps
    b = run(tiny_lm, [1, 2, 3], SampleConfig(max_new_tokens=3)).steps
    fig = figures.tokens_vs_time({"greedy": a, "sample": b})
    assert [t.name for t in fig.data] == ["greedy", "sample"]
    assert list(fig.data[0].y) == [0, 1, 2, 3, 4, 5] and fig.data[1].y[-1] == 3
    assert fig.data[0].x[-1] == pytest.approx(sum(sum(e.timings_ms.values()) for e in a))
    assert fig.data[0].line.dash != fig.data[1].line.dash    # the shape twin of the lane colour


# ------------------------------------------------------------------ tables

def test_tables_columns_and_rows(tiny_lm):
    trace = run(tiny_lm, [1, 2, 3], SampleConfig(max_new_tokens=4, top_n=7, top_k=5, temperature=0.8))
    steps = tables.steps_table(trace.steps)
    assert len(steps) == 4 and list(steps.columns) == [
        "step", "position", "token_id", "piece", "forced", "p_processed", "p_raw", "raw_rank", "entropy_raw",
        "entropy_processed", "u", "ms"]
    assert list(steps["token_id"]) == list(trace.output_ids)
    cands = tables.candidates_table(trace.steps[0])
    assert list(cands.columns) == tables.CANDIDATE_COLUMNS and len(cands) == 7
    assert cands["chosen"].sum() == (trace.steps[0].chosen_id in set(cands["token_id"]))
    assert (cands["removed_by"] == "top_k").sum() == 2
    filt = tables.filters_table(trace.steps[0])
    assert list(filt["filter"]) == ["temperature", "top_k"]
    cut = trace.steps[0].filters[1]
    assert filt["cut_at"].isna().iloc[0] and filt["cut_at"].iloc[1] == f"logit ≥ {cut.threshold:.4g} (the k-th largest)"
    assert list(filt["threshold"])[1] == cut.threshold                # the raw value stays, last (and in the CSV)
    assert tables.cut_words("top_p", 0.97421) == "kept mass 0.9742 (the first ≥ top-p)"
    assert tables.cut_words("min_p", 0.0123) == "p ≥ 0.0123 (min-p × the top p)"
    metrics = tables.running_metrics(trace.steps)
    assert metrics["tokens"] == 4 and metrics["target_forwards"] == 4 and metrics["tokens_per_s"] > 0
    table = tables.metrics_table({"a": trace, "b": trace})
    assert list(table["first_divergence"]) == [None, None] and list(table["tokens"]) == [4, 4]
    parts = [c for part in tables.METRICS_PARTS for c in part]
    assert set(parts) == set(table.columns) and len(parts) == len(table.columns) + 1   # each once, the lane twice


# ------------------------------------------------------------------ chips

def _token_event(piece: str, forced=False, chosen_id=7) -> TokenStep:
    return TokenStep(index=0, position=3, raw_top=(), processed_top=(), filters=(), entropy_raw=1.0,
                     entropy_processed=1.0, chosen_id=chosen_id, chosen_piece=piece, chosen_logprob=-0.5,
                     chosen_raw_logprob=-0.7, chosen_rank=1, draw=0.25, forced=forced)


def test_chips_escape_pieces_and_tooltips():
    html = chips_html(chips_for([_token_event("<script>alert('x')</script>")]))
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    evil_tip = chip_html(Chip('a', "target", '" onmouseover="alert(1)', 0))
    assert 'onmouseover="' not in evil_tip and "&quot; onmouseover=&quot;alert(1)" in evil_tip
    assert "<b>" not in chips_html([Chip("x", "target", "t", 0)], prefix="<b>prompt</b>")
    box = token_box_html("<img src=x onerror=alert(1)>", 5, note="<i>")
    assert "<img" not in box and "<i>" not in box and "&lt;img" in box


def test_figure_labels_escape_trace_strings(tiny_lm):
    import dataclasses

    step, _, _ = make_step(tiny_lm, temperature=1.2, top_k=5, top_n=6)
    evil = '<a href="https://example.com">x</a>'
    top = tuple(dataclasses.replace(c, piece=evil) for c in step.raw_top)
    step = dataclasses.replace(step, raw_top=top,
                               processed_top=tuple(dataclasses.replace(c, piece=evil) for c in step.processed_top))
    labels = list(figures.probability_bars(step).data[0].x) + list(figures.draw_cdf(step).data[0].x)
    assert labels and all("<a" not in x and '&lt;a href="' in x for x in labels)
    quoted = tuple(dataclasses.replace(c, piece="'s") for c in step.raw_top)       # plotly shows no &quot;
    shown = figures.probability_bars(dataclasses.replace(step, raw_top=quoted, processed_top=quoted)).data[0].x
    assert all("&" not in x and "'s" in x for x in shown)
    waterfall = figures.timing_waterfall({"<b>x</b>": 1.0})
    assert list(waterfall.data[0].y) == ["&lt;b&gt;x&lt;/b&gt;"]


def test_a_long_run_in_progress_draws_its_last_chips_with_a_note():
    chips = [Chip(f"t{i}", "target", "", i) for i in range(10)]
    kept, note = last_chips(chips, 4)
    assert [c.step for c in kept] == [6, 7, 8, 9] and note.startswith("… 6 earlier chips")
    assert last_chips(chips, None) == (chips, "") and last_chips(chips, 10) == (chips, "")
    html = chips_html(kept, prefix=note)
    assert html.count('data-step=') == 4 and 'data-step="6"' in html and 'data-step="5"' not in html


def test_chips_origin_colour_has_a_text_twin():
    html = chips_html(chips_for([_token_event("a"), _token_event("b", forced=True)]), current_step=0)
    assert 'ds-origin-target' in html and 'ds-origin-forced' in html
    assert "⚑" in html and "dashed" in html             # the forced chip's mark and line style
    assert "p processed 0.6065" in html and "u 0.2500" in html      # tooltip numbers
    assert html.count("ds-current") == 3                  # CSS rule + both chips of step 0
    legend = legend_html(("target", "forced", "accepted", "rejected", "residual", "bonus"))
    assert all(mark in legend for mark in ("⚑", "✓", "✗", "↺", "+"))


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    html = chips_html(chips_for([_token_event("a"), _token_event("b")]), diverge_at=1)
    assert html.index('class="ds-diverge"') > html.index(">a<")


# ------------------------------------------------------------------ parameters and URL

def test_param_fields_and_config_errors():
    assert [f.name for f in param_fields("sample")] == ["temperature", "top_k", "top_p", "min_p"]
    assert param_fields("greedy") == []
    with pytest.raises(ConfigError) as err:
        build_config("sample", {"temperature": 0.0}, seed=0, max_new_tokens=8, top_n=5)
    assert err.value.param == "temperature"
    with pytest.raises(ConfigError) as err:
        build_config("greedy", {}, seed=0, max_new_tokens=0, top_n=5)
    assert err.value.param == "max_new_tokens"
    with pytest.raises(ConfigError) as err:
        build_config("nope", {}, seed=0, max_new_tokens=8, top_n=5)
    assert err.value.param == "strategy"


def test_query_round_trip():
    settings = Settings(strategy="sample", params={"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.0},
                        seed=3, prompt="Hi & <bye>", chat_template=False)
    shared, params, bad = from_query(to_query(settings))
    assert bad == [] and params == settings.params
    assert (shared["strategy"], shared["seed"], shared["prompt"], shared["chat"]) == ("sample", 3, "Hi & <bye>", False)
    _, _, bad = from_query({"strategy": "sample", "seed": "x", "top_k": "1.5", "chat": "maybe"})
    assert sorted(bad) == ["chat", "seed", "top_k"]


# ------------------------------------------------------------------ the step-through run

def _plain(events):
    return [without_timings(e) for e in events]


@pytest.mark.parametrize("config", [GreedyConfig(max_new_tokens=7, top_n=4),
                                    SampleConfig(max_new_tokens=7, top_n=4, temperature=1.2, seed=5)])
def test_live_run_steps_like_one_engine_run(tiny_lm, config):
    prompt = [3, 1, 4, 1, 5]
    truth = run(tiny_lm, prompt, config)
    live = LiveRun(tiny_lm, prompt, config)
    assert live.step(2) == 2 and live.step(1) == 1
    live.run_to_end()
    assert live.done and _plain(live.events) == _plain(truth.steps)
    assert live.trace().output_ids == truth.output_ids and live.trace().stop_reason == truth.stop_reason
    assert live.step(1) == 0


def test_live_run_rebuilds_its_generator_exactly(tiny_lm):
    config = SampleConfig(max_new_tokens=8, top_n=4, temperature=1.5, seed=11)
    prompt = [2, 7, 1, 8]
    truth = run(tiny_lm, prompt, config)
    live = LiveRun(tiny_lm, prompt, config)
    live.step(3)
    live._gen = None                          # lost between reruns: rebuilt with forced= the tokens so far
    live.run_to_end()
    assert _plain(live.events) == _plain(truth.steps)
    wrong = LiveRun(tiny_lm, prompt, config)  # negative control: a fresh generator without the replay
    wrong.step(3)
    wrong._gen = LiveRun(tiny_lm, prompt, config)._generator()
    wrong.run_to_end()
    assert _plain(wrong.events) != _plain(truth.steps)


def test_branch_keeps_the_prefix_and_continues_from_the_forced_token(tiny_lm):
    config = SampleConfig(max_new_tokens=8, top_n=6, temperature=1.3, seed=2)
    prompt = [9, 9, 2]
    live = LiveRun(tiny_lm, prompt, config)
    live.run_to_end()
    at = 3
    choice = next(c.token_id for c in live.events[at].raw_top if c.token_id != live.events[at].chosen_id)
    branch = live.branch(at, choice)
    branch.run_to_end()
    assert branch.events[:at] == live.events[:at]
    assert branch.events[at].chosen_id == choice and branch.events[at].forced
    forced = live.output_ids[:at] + [choice]
    truth = run(tiny_lm, prompt, config, forced=forced)
    assert _plain(branch.events[at:]) == _plain(truth.steps[at:])
    assert branch.trace().forced_ids == tuple(forced)
    with pytest.raises(ConfigError):
        live.branch(99, choice)

