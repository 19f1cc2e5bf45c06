"""Compare's verdict, the slower-than-greedy sentence, a round that accepts nothing, and the settings that
made a result (ui/views/verdict.py, ui/views/made_with.py): real traces of a tiny model where they fit,
hand-built events where a case must be forced, each with a negative control."""
from __future__ import annotations

import dataclasses

import pytest

import ui.widgets.strategy_panels  # noqa: F401  (registers the speculative chips, as app.py does)
from decoding.core.config import GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.trace import Candidate, DraftPosition, PlanNode
from decoding.core.trace_totals import emitted_count
from decoding.runner import run
from ui.views import made_with, tables, verdict
from ui.views.chips import Chip, emitted_text
from ui.views.presets import PRESETS, preset_for
from ui.views.tour import STOPS

PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]


@pytest.fixture(scope="module")
def lanes(tiny_lm):
    return {"1: greedy": run(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=12)),
            "2: speculative": run(tiny_lm, PROMPT, SpeculativeConfig(draft="lookup", gamma=3, max_new_tokens=12)),
            "3: sample": run(tiny_lm, PROMPT, SampleConfig(temperature=1.0, max_new_tokens=12, seed=1))}


def test_exact_lanes_are_token_identical_and_a_sampled_one_diverges_with_both_tokens(lanes):
    greedy, spec_, sample = lanes.values()
    assert spec_.output_ids == greedy.output_ids          # the engine's promise the verdict reports
    assert sample.output_ids != greedy.output_ids         # the negative control below depends on it
    lines = verdict.verdict_lines(lanes)
    assert lines[0] == "2: speculative: token-identical to greedy (12 tokens)."
    at = next(i for i, (a, b) in enumerate(zip(greedy.output_ids, sample.output_ids)) if a != b)
    ours, theirs = verdict.emitted_pieces(sample.steps)[at], verdict.emitted_pieces(greedy.steps)[at]
    assert lines[1] == (f"3: sample: diverges from greedy at token {at + 1} ({ours!r} here, {theirs!r} in greedy) "
                        "— it samples at temperature 1, so it need not match.")


def test_one_line_for_all_when_every_lane_matches(lanes):
    same = {k: v for k, v in lanes.items() if "sample" not in k}
    assert verdict.verdict_lines(same) == ["All 2 lanes emitted the same 12 tokens: token-identical to greedy."]
    # negative control: one changed token in the speculative lane breaks the one-line verdict
    changed = dataclasses.replace(same["2: speculative"], output_ids=(99,) + same["2: speculative"].output_ids[1:])
    lines = verdict.verdict_lines({**same, "2: speculative": changed})
    assert lines[0].startswith("2: speculative: diverges from greedy at token 1 ")


def test_emitted_pieces_skip_rejected_drafts(lanes):
    spec_ = lanes["2: speculative"]
    assert len(verdict.emitted_pieces(spec_.steps)) == len(spec_.output_ids)


def _timed(trace, ms: float):
    return dataclasses.replace(trace, steps=tuple(dataclasses.replace(s, timings_ms={"forward": ms})
                                                  for s in trace.steps))


def test_a_slower_lane_says_what_a_round_cost_in_plain_tokens(lanes):
    greedy = _timed(lanes["1: greedy"], 40.0)
    rounds = lanes["2: speculative"].steps[1:]
    emitted = sum(len(r.emitted) for r in rounds) / len(rounds)
    cost_ms = 40.0 * emitted * 1.25           # every round costs 1.25× what it emitted, in plain tokens
    slow = _timed(lanes["2: speculative"], cost_ms)
    line = verdict.slower_line("2: speculative", slow, greedy)
    speed = tables.metrics_table({"1: greedy": greedy, "2: speculative": slow})["speedup_vs_greedy"][1]
    assert speed < 0.95                       # the prefill round costs as much too: slower than 1 / 1.25 overall
    assert line == (f"2: speculative is slower than greedy ({speed:.2f}×): a round cost {cost_ms / 40:.2f} plain "
                    f"tokens of time and emitted {emitted:.2f} tokens on average ({len(rounds)} rounds after the "
                    "first; a plain token = greedy's mean step, 40 ms).")
    # negative control: rounds that cost less than they emit are not slower, and get no sentence
    assert verdict.slower_line("2: speculative", _timed(lanes["2: speculative"], 40.0 * emitted * 0.8), greedy) is None
    assert verdict.slower_lines({"1: greedy": greedy, "2: speculative": slow}) == [line]
    # within the lanes' own noise (0.97× greedy, as the table counts it) a lane is not called slower; at 0.9× it is
    spec = lanes["2: speculative"]
    per_step = sum(emitted_count(e) for e in spec.steps) / len(spec.steps)
    assert verdict.slower_line("2: speculative", _timed(spec, 40.0 * per_step / 0.97), greedy) is None
    assert verdict.slower_line("2: speculative", _timed(spec, 40.0 * per_step / 0.9), greedy)


def _jittered(trace, ms: float, jitter: float):
    """Each step `ms` × (1 ± jitter), alternating: a lane whose steps vary by that much."""
    return dataclasses.replace(trace, steps=tuple(
        dataclasses.replace(s, timings_ms={"forward": ms * (1 + (jitter if i % 2 else -jitter))})
        for i, s in enumerate(trace.steps)))


def test_a_speed_range_says_how_far_one_run_pins_the_ratio(lanes):
    """The bootstrap over steps: steady steps give a range of one point (the table's ratio); steps that vary
    give a range around it that widens with the variation; seeded, so every rerun shows the same range."""
    greedy, sample = _timed(lanes["1: greedy"], 40.0), _timed(lanes["3: sample"], 40.0)
    assert verdict.speed_range(sample, greedy) == pytest.approx((1.0, 1.0))
    ratio = tables.metrics_table({"1: greedy": greedy, "3: sample": _jittered(sample, 40.0, 0.3)}).iloc[1]
    low, high = verdict.speed_range(_jittered(sample, 40.0, 0.3), greedy)
    assert low < ratio["speedup_vs_greedy"] < high and high - low > 0.1
    narrow = verdict.speed_range(_jittered(sample, 40.0, 0.05), greedy)
    assert narrow[1] - narrow[0] < (high - low) / 3                  # control: less variation, a narrower range
    assert verdict.speed_range(_jittered(sample, 40.0, 0.3), greedy) == (low, high)
    line = verdict.range_line({"1: greedy": greedy, "3: sample": _jittered(sample, 40.0, 0.3)})
    assert f"3: sample {low:.2f}–{high:.2f}×" in line and "90% of 400 resamples" in line
    assert verdict.range_line({"3: sample": sample}) is None                      # no greedy lane: no range
    short = dataclasses.replace(sample, steps=sample.steps[:2])
    assert verdict.speed_range(short, greedy) is None                              # too few steps to resample


def test_emitted_text_drops_rejected_drafts_and_marks_but_keeps_forced():
    chips = [Chip("a", "accepted", "", 0), Chip("x", "rejected", "", 0, emitted=False), Chip("b", "residual", "", 0),
             Chip("f", "forced", "", 1), Chip("c", "bonus", "", 1)]
    assert [(c.piece, c.origin) for c in emitted_text(chips)] == [("a", "target"), ("b", "target"),
                                                                    ("f", "forced"), ("c", "target")]


# ---------------------------------------------------------------- a round that accepts nothing

def _spec_round(drafts, accepted, final_id=9, final_piece="fin"):
    from decoding.core.trace import SpecRound
    emitted = tuple(d.token_id for d in drafts[:accepted]) + (final_id,)
    return SpecRound(index=3, position=10, drafter="lookup", gamma=len(drafts), gamma_policy="fixed",
                     gamma_reason="", drafts=tuple(drafts), accepted=accepted, final_kind="residual",
                     final_id=final_id, final_draw=None, final_top=(Candidate(final_id, final_piece, 0.0, 0.6),),
                     residual_top=(), emitted=emitted, final_piece=final_piece)


def _draft(k, token, verdict_, u=None):
    return DraftPosition(index=k, token_id=token, piece=f"S{token}", q_draft=None if u is None else 0.5,
                         p_target=0.1, ratio=0.2, accept_prob=0.1, u=u, verdict=verdict_)


def test_a_greedy_round_that_accepts_nothing_names_both_tokens():
    event = _spec_round([_draft(0, 5, "rejected"), _draft(1, 6, "not_reached")], 0)
    assert verdict.nothing_accepted(event) == ("Nothing accepted: the draft's first token was not the target's "
                                               "choice: 'S5' proposed, 'fin' chosen.")
    sampled = _spec_round([_draft(0, 5, "rejected", u=0.731)], 0)
    assert verdict.nothing_accepted(sampled) == ("Nothing accepted: the draft's first token 'S5' was rejected (draw "
                                                 "u = 0.731 above p target ÷ q draft = 0.200); 'fin' was drawn from "
                                                 "the residual instead.")
    # negative controls: a round that accepted a draft, and one with no drafts, say nothing
    assert verdict.nothing_accepted(_spec_round([_draft(0, 5, "accepted"), _draft(1, 6, "rejected")], 1)) is None
    assert verdict.nothing_accepted(_spec_round([], 0)) is None


def _node(node, depth, token, verdict_):
    return PlanNode(node=node, parent=0, depth=depth, cand=node - 1, token_id=token, piece=f"c{token}", score=0.5,
                    survival=0.5, p_target=0.1, p_accept=None, draw=None, verdict=verdict_)


def test_a_dspark_round_that_accepts_nothing_names_its_first_candidates():
    from decoding.core.trace import DSparkRound
    nodes = (_node(1, 1, 7, "rejected"), _node(2, 1, 8, "rejected"), _node(3, 2, 9, "not_reached"))
    event = DSparkRound(index=2, position=10, prefill=False, select="tree", lattice=(), dp=None, nodes=nodes,
                        expected_accepted=0.6, size=None, accepted_path=(), next_token=4, next_from="argmax",
                        next_draw=None, emitted=(4,), next_piece="four")
    assert verdict.nothing_accepted(event) == ("Nothing accepted: none of the 2 candidates drafted for the first "
                                               "position ('c7', 'c8') was the target's choice, 'four'.")
    drawn = dataclasses.replace(event, next_from="residual",
                                nodes=tuple(dataclasses.replace(n, draw=0.9, p_accept=0.1) for n in nodes))
    assert verdict.nothing_accepted(drawn) == ("Nothing accepted: the candidate(s) drafted for the first position "
                                               "('c7', 'c8') were rejected by their draws; 'four' was drawn from the "
                                               "residual instead.")
    accepted = dataclasses.replace(event, accepted_path=(1,), emitted=(7, 4), next_from="bonus")
    assert verdict.nothing_accepted(accepted) is None                       # negative control
    assert verdict.nothing_accepted(dataclasses.replace(event, prefill=True)) is None


# ---------------------------------------------------------------- made with

def test_made_with_names_what_changed_and_nothing_when_equal():
    made = made_with.describe(model="m", prompt="Hi", chat_template=True, seed=0, max_new_tokens=6, top_n=5,
                              configs={"strategy": GreedyConfig(max_new_tokens=6)})
    same = made_with.describe(model="m", prompt="Hi", chat_template=True, seed=0, max_new_tokens=6, top_n=5,
                              configs={"strategy": GreedyConfig(max_new_tokens=6)})
    assert made_with.stale_line(made, same) is None
    now = made_with.describe(model="m", prompt="Hi", chat_template=True, seed=0, max_new_tokens=8, top_n=5,
                             configs={"strategy": SpeculativeConfig(draft="lookup", max_new_tokens=8)})
    changed = made_with.changes(made, now)
    assert changed[0] == "max new tokens 6 → 8"
    assert changed[1].startswith("strategy greedy → speculative: ") and "draft lookup" in changed[1]
    assert "run again" in made_with.stale_line(made, now)


def test_presets_hold_the_tours_prompts_and_a_copy_and_a_free_writing_one():
    prompts = {p.prompt for p in PRESETS}
    assert {s.prompt for s in STOPS} <= prompts
    assert preset_for(PRESETS[0].prompt).name == "Copy a text" and preset_for("not a preset") is None
    assert any(p.name == "Free writing" for p in PRESETS) and any("Summarize" in p.name for p in PRESETS)


def test_a_result_names_its_model_without_the_servers_path():
    assert made_with.model_name("default") == "default"
    assert made_with.model_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for path in ("/srv/models/tiny", "./models/tiny", "C:\\models\\tiny", "/srv/models/tiny/"):
        assert made_with.model_name(path) == "tiny", path
    made = made_with.describe(model="/srv/secret/tiny", prompt="p", chat_template=False, seed=0, max_new_tokens=1,
                              top_n=1)
    assert "/srv" not in made_with.line(made) and "secret" not in made_with.line(made)


def test_a_links_step_is_a_whole_number_below_max_new_tokens():
    from ui.widgets.links import linked_step
    from ui.widgets.params import Settings

    settings = Settings(max_new_tokens=6)
    assert linked_step(None, settings) == (None, None)
    assert linked_step("0", settings) == (0, None) and linked_step("5", settings) == (5, None)
    for bad in ("6", "-1", "³", " 3", "2.0", "abc", "9" * 40, ""):
        step, refusal = linked_step(bad, settings)
        assert step is None and refusal.startswith("step=") and "[0, 6)" in refusal, bad
        assert len(refusal) < 120


def test_a_branch_names_its_forced_token_by_its_text(lanes):
    """The flash after Force & branch quotes the forced token (the emitted chip at its place) with its id;
    past the emitted text (a control) it falls back to the id alone."""
    greedy = lanes["1: greedy"]
    forced = list(greedy.output_ids[:4])
    piece = greedy.steps[3].chosen_piece
    assert verdict.branched_line(3, forced, greedy.steps) == \
        f"Branched at step 3: {piece!r} (id {forced[-1]}) forced as token 4 of the text (tokens count from 1), " \
        "the text before it kept as it was."
    assert verdict.branched_line(3, forced, greedy.steps[:2]).startswith(f"Branched at step 3: id {forced[-1]} ")
