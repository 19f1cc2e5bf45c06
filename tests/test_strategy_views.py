"""Pure helpers of the beam and speculative views and the what-if sweep: hand-computed oracles, each
with a negative control that must fail the same check."""
from __future__ import annotations

import dataclasses
import re

import pytest

from decoding.core.config import BeamConfig, SpeculativeConfig
from decoding.core.trace import Candidate, DraftPosition, ProbEntry, SpecRound
from decoding.runner import run
from ui.views import beam, spec, whatif
from ui.views.chips import Chip, chips_html

HOSTILE = ['"];\nevil [label="x', "<script>alert(1)</script>", "back\\slash\\n\\l", "tab\there", "<b>&amp;</b>"]


# ------------------------------------------------------------------ what-if

def test_expected_accepted_hand_computed():
    a = [0.5, 0.8, 0.25]
    # gamma=1: 0.5; gamma=2: 0.5 + 0.5*0.8 = 0.9; gamma=3: 0.9 + 0.5*0.8*0.25 = 1.0
    assert whatif.expected_accepted(a, 1) == pytest.approx(0.5)
    assert whatif.expected_accepted(a, 2) == pytest.approx(0.9)
    assert whatif.expected_accepted(a, 3) == pytest.approx(1.0)
    assert whatif.tokens_per_verification(a, 3) == pytest.approx(2.0)
    assert whatif.expected_accepted(a, 10) == pytest.approx(1.0)    # only three recorded


def test_expected_accepted_negative_control():
    """Summing the a_i without the survival product (ignoring that a rejection ends the chain) must
    give a different number on the same example."""
    a = [0.5, 0.8, 0.25]
    wrong = sum(a[:2])                                                  # 1.3
    assert wrong != pytest.approx(0.9)
    assert whatif.expected_accepted(a, 2) != pytest.approx(wrong)


def _round(index, drafts, accepted, final_kind="residual", final_id=9, forced=(), emitted=None, residual=()):
    emitted = emitted if emitted is not None else tuple(d.token_id for d in drafts[:accepted]) + (final_id,)
    return SpecRound(index=index, position=10 + index, drafter="lookup", gamma=len(drafts), gamma_policy="fixed",
                     gamma_reason="fixed: gamma=3", drafts=tuple(drafts), accepted=accepted, final_kind=final_kind,
                     final_id=final_id, final_draw=0.5, final_top=(Candidate(final_id, "fin", 0.0, 0.6, None),),
                     residual_top=tuple(residual), emitted=tuple(forced) + tuple(emitted), forced_ids=tuple(forced))


def _draft(k, token, accept_prob, verdict, piece=None, u=0.3):
    return DraftPosition(index=k, token_id=token, piece=piece or f"t{token}", q_draft=0.9, p_target=accept_prob,
                         ratio=accept_prob / 0.9, accept_prob=accept_prob, u=u, verdict=verdict)


def test_sweep_averages_rounds_and_counts_short_ones():
    r0 = _round(0, [_draft(0, 1, 0.5, "accepted"), _draft(1, 2, 0.8, "rejected")], 1)
    r1 = _round(1, [_draft(0, 3, 1.0, "accepted")], 1, final_kind="bonus")
    table = whatif.sweep([r0, r1], [1, 2])
    # gamma=1: (0.5 + 1.0) / 2 = 0.75; gamma=2: (0.9 + 1.0) / 2 = 0.95 (r1 recorded one draft)
    assert list(table["expected_accepted"]) == pytest.approx([0.75, 0.95])
    assert list(table["expected_tokens_per_forward"]) == pytest.approx([1.75, 1.95])
    assert list(table["expected_acceptance_rate"]) == pytest.approx([0.75, 1.9 / 3])
    assert list(table["short_rounds"]) == [0, 1]
    m = whatif.measured([r0, r1])
    assert m["tokens_per_forward"] == pytest.approx(2.0) and m["acceptance_rate"] == pytest.approx(2 / 3)


def test_greedy_rounds_use_argmax_agreement():
    """At temperature 0 (no u) a position is accepted exactly when it is the target's argmax."""
    top = lambda t: (Candidate(t, "x", 0.0, 0.4, None),)                              # noqa: E731
    d0 = DraftPosition(0, 5, "a", None, 0.4, 0.4, 0.4, None, "accepted", target_top=top(5))
    d1 = DraftPosition(1, 6, "b", None, 0.3, 0.3, 0.3, None, "rejected", target_top=top(7))
    r = _round(0, [d0, d1], 1)
    assert whatif.round_accept_probs(r) == [1.0, 0.0]
    assert whatif.sweep([r], [2])["expected_accepted"][0] == pytest.approx(1.0)
    assert whatif.measured([r])["mean_accepted"] == 1.0


def test_sweep_matches_the_measured_rate_on_a_greedy_lookup_trace(tiny_lm):
    """At temperature 0 the recorded outcomes are deterministic, so the expected accepted drafts at the
    trace's own gamma equal the measured ones exactly."""
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    trace = run(tiny_lm, prompt, SpeculativeConfig(draft="lookup", max_new_tokens=24, gamma=3))
    m = whatif.measured(trace.steps)
    expected = whatif.sweep(trace.steps, [3])["expected_accepted"][0]
    assert expected == pytest.approx(m["mean_accepted"])
    # negative control: reading the recorded p_target as the acceptance probability at T=0 is wrong
    soft = sum(whatif.expected_accepted([d.accept_prob for d in r.drafts], 3) for r in trace.steps) / len(trace.steps)
    assert soft != pytest.approx(m["mean_accepted"])


# ------------------------------------------------------------------ speculative chips and tables

def test_spec_chips_by_origin_and_hostile_pieces_escaped():
    drafts = [_draft(0, 1, 0.9, "accepted", piece=HOSTILE[1]), _draft(1, 2, 0.2, "rejected", piece=HOSTILE[4]),
              _draft(2, 3, 0.5, "not_reached")]
    r = _round(0, drafts, 1, residual=(ProbEntry(9, "fin", 0.7),))
    chips = spec.spec_chips(r)
    assert [(c.origin, c.emitted) for c in chips] == [("accepted", True), ("rejected", False), ("residual", True)]
    assert "q draft 0.9000" in chips[0].tooltip and "u 0.3000" in chips[0].tooltip
    assert "p residual 0.7000" in chips[2].tooltip
    html = chips_html(chips)
    assert "<script>" not in html and "<b>" not in html and "&lt;script&gt;" in html
    bonus = spec.spec_chips(_round(1, drafts[:1], 1, final_kind="bonus"))
    assert [c.origin for c in bonus] == ["accepted", "bonus"]
    assert "all 1 drafts accepted" in bonus[1].tooltip


def test_a_round_without_drafts_does_not_claim_accepted_drafts():
    plain = spec.spec_chips(_round(2, (), 0, final_kind="bonus"))
    assert [c.origin for c in plain] == ["bonus"]
    assert "no drafts" in plain[0].tooltip and "accepted" not in plain[0].tooltip


def test_divergence_marker_skips_chips_not_emitted():
    chips = [Chip("a", "accepted", "", 0), Chip("x", "rejected", "", 0, emitted=False), Chip("b", "residual", "", 0)]
    html = chips_html(chips, diverge_at=1)
    # the marker precedes "b" (emitted index 1), not the rejected "x" (chip index 1)
    assert re.search(r'ds-diverge.*?</span><span[^>]*>b<', html)
    assert not re.search(r'ds-diverge.*?</span><span[^>]*>x<', html)


def test_spec_tables_and_figures_from_a_run(tiny_lm):
    trace = run(tiny_lm, [3, 4, 5, 3, 4, 5, 3, 4],
                SpeculativeConfig(draft="lookup", max_new_tokens=8, gamma=3, temperature=1.0))
    event = trace.steps[0]
    table = spec.drafts_table(event)
    assert list(table.columns) == spec.DRAFT_COLUMNS and len(table) == len(event.drafts)
    spec.draft_bars(event)
    spec.residual_bars(event)
    m = spec.spec_metrics(trace.steps)
    assert m["tau"] == pytest.approx(trace.stats.mean_accepted_length)
    for r in trace.steps:                      # the final token's piece is recorded, so its chip reads as text
        final = [c for c in spec.spec_chips(r) if c.origin in ("residual", "bonus")]
        assert [c.piece for c in final] == ([tiny_lm.piece(r.final_id)] if r.final_kind != "none" else [])


# ------------------------------------------------------------------ beam

@pytest.fixture(scope="module")
def beam_trace(tiny_lm):
    return run(tiny_lm, [1, 2, 3, 4], BeamConfig(max_new_tokens=5, num_beams=3))


def test_beam_best_path_is_the_output(beam_trace, tiny_lm):
    path = beam.best_path(beam_trace.steps)
    tokens = [beam_trace.steps[s].pool[r].token_id for s, r in path]
    assert tokens == list(beam_trace.output_ids)
    chips = beam.beam_chips(beam_trace.steps)
    assert [c.piece for c in chips] == [tiny_lm.piece(t) for t in beam_trace.output_ids]
    assert [c.step for c in chips] == list(range(len(chips)))


def test_beam_mid_run_path_ends_at_the_best_live_beam(beam_trace):
    events = beam_trace.steps[:3]
    path = beam.best_path(events)
    assert [s for s, _ in path] == [0, 1, 2]
    last = events[-1].pool[path[-1][1]]
    assert last.status == "kept" and last.token_id == events[-1].beams[0].token_id


def _dot_labels(dot: str) -> list[str]:
    """Unescape every label="..." of a DOT text the way Graphviz reads a quoted string."""
    return [re.sub(r'\\(.)', r'\1', m) for m in re.findall(r'label="((?:[^"\\]|\\.)*)"', dot)]


def _dot_statements(dot: str) -> int:
    return len(re.findall(r'^\s*\w+ \[label=', dot, flags=re.M))


def test_dot_labels_escape_hostile_pieces(beam_trace):
    import dataclasses

    steps = list(beam_trace.steps)
    pool = list(steps[0].pool)
    for i, piece in enumerate(HOSTILE[: len(pool)]):
        pool[i] = dataclasses.replace(pool[i], piece=piece)
    steps[0] = dataclasses.replace(steps[0], pool=tuple(pool))
    dot = beam.beam_dot(steps, upto=0)
    labels = _dot_labels(dot)
    assert len(labels) == 1 + len(pool) and _dot_statements(dot) == 1 + len(pool)
    assert any(repr('"];↵evil [label="x') in label for label in labels)
    assert "\n" not in "".join(labels) and "\t" not in "".join(labels)
    assert any("<script>" in label for label in labels)     # text, shown as text by Graphviz
    # negative control: the same pieces pasted in unescaped break the DOT structure
    naive = "\n".join(f'  s0c{i} [label="{piece}"];' for i, piece in enumerate(HOSTILE))
    assert len(_dot_labels(naive)) != len(HOSTILE) or _dot_statements(naive) != len(HOSTILE)


def test_dot_escape_round_trips():
    for piece in HOSTILE:
        escaped = beam.dot_escape(piece)
        assert '"' not in re.sub(r'\\.', "", escaped)            # no bare quote survives
        assert re.sub(r'\\(.)', r'\1', escaped).replace("↵", "\n").replace("⇥", "\t") == piece


def test_pool_table_and_rows(beam_trace):
    step = beam_trace.steps[1]
    table = beam.pool_table(step)
    assert list(table["rank"]) == list(range(1, len(step.pool) + 1)) and set(table["status"]) <= set(beam.STATUS_STYLE)
    assert beam.beam_row(step)["n_kept"] == len(step.beams)


def test_finished_hypotheses_carry_their_text(beam_trace):
    """Issue 46: the finished-hypotheses table had no text. Each row's text is its tokens' pieces; the best
    one's is the output beam search returns."""
    from decoding.core.trace_totals import beam_output_ids

    last = beam_trace.steps[-1]
    table = beam.finished_table(last, beam_trace.steps)
    pieces = beam.pieces_of(beam_trace.steps)
    assert list(table["rank"]) == list(range(1, len(last.finished) + 1))
    best = beam_output_ids(beam_trace.steps)[len(last.forced_ids):]
    assert table["text"].iloc[0] == beam.hypothesis_text(best, pieces) and "⟨" not in table["text"].iloc[0]
    assert all(table["text"].str.len() > 0)


def test_whatif_cost_column_from_a_cost_policy_trace():
    """Two rounds of a cost-policy trace (table 10/11/12/19 ms for 1-4 tokens, draft 1 ms, lookup 0):
    γ=1: (11 + 1 + 11 + 0) ms over (1.5 + 2.0) tokens; γ=2: r0 drafts 2 (12 + 2 ms, 1.9 tokens), r1
    recorded 1 (11 ms, 2.0 tokens)."""
    from decoding.core.trace import GammaChoiceInfo

    def choice(source, draft_ms):
        return GammaChoiceInfo(source=source, cost_source="t", verify_ms=(10.0, 11.0, 12.0, 19.0), draft_ms=draft_ms,
                               acceptance=(0.5, 0.5, 0.5), expected_tokens=(1.5, 1.75, 1.875),
                               ms_per_token=(8.0, 8.0, 11.7), gamma=1)

    r0 = dataclasses.replace(_round(0, [_draft(0, 1, 0.5, "accepted"), _draft(1, 2, 0.8, "rejected")], 1),
                             drafter="m", gamma_choice=choice("m", 1.0))
    r1 = dataclasses.replace(_round(1, [_draft(0, 3, 1.0, "accepted")], 1, final_kind="bonus"),
                             gamma_choice=choice("lookup", 0.0))
    table = whatif.with_cost(whatif.sweep([r0, r1], [1, 2, 3, 4]), [r0, r1])
    ms = list(table["expected_ms_per_token"])
    assert ms[:3] == pytest.approx([23 / 3.5, 25 / 3.9, 25 / 3.9])    # γ 3: no round recorded a third draft
    assert ms[3] is None or ms[3] != ms[3]                            # γ 4 needs 5 tokens: beyond the table
    plain = _round(0, [_draft(0, 1, 0.5, "accepted")], 1)
    assert "expected_ms_per_token" not in whatif.with_cost(whatif.sweep([plain], [1]), [plain])


def test_lookup_names_the_matched_tokens_in_words(tiny_lm):
    """Prompt lookup's n-gram is the text's last n tokens: the round's line quotes their text, taken from the
    emitted chips before the round; while they lie in the prompt (no chips), it gives their ids."""
    import ui.widgets.strategy_panels  # noqa: F401  (registers each round kind's chips)
    from ui.views.chips import ngram_words, visible
    trace = run(tiny_lm, [3, 4, 5, 3, 4, 5, 3, 4], SpeculativeConfig(draft="lookup", max_new_tokens=24, gamma=3))
    piece = {d.token_id: d.piece for r in trace.steps for d in r.drafts}
    piece.update({r.final_id: r.final_piece for r in trace.steps if r.final_piece})
    said = 0
    for i, event in enumerate(trace.steps):
        m = event.lookup
        emitted = sum(len(r.emitted) for r in trace.steps[:i])
        if m is None or emitted < len(m.ngram) or not all(t in piece for t in m.ngram):
            continue
        words = repr(visible("".join(piece[t] for t in m.ngram)))
        assert ngram_words(m.ngram, trace.steps[:i]) == words
        assert f"last {len(m.ngram)} token(s) {words} earlier" in spec.lookup_text(event, trace.steps[:i])
        said += 1
    assert said >= 2
    first = next(e for e in trace.steps if e.lookup is not None)
    assert ngram_words(first.lookup.ngram, ()) == "ids " + ", ".join(map(str, first.lookup.ngram))   # control
