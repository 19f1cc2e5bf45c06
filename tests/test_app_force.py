"""AppTest of "Force & branch" on the beam, speculative and DSpark step panels (the greedy one is in
test_app): the select boxes beside the charts pick a candidate, the button branches, and the Branch
view shows the branch, its forced tokens by their text, next to the untouched original."""
from __future__ import annotations

import html
import re

import pytest
from app_support import REPEAT, drafter_file, new_app, ok, run_state, run_to_end  # noqa: F401  (drafter_file: fixture)
from dspark_helpers import APP_CHAIN

from ui.views.chips import visible
from ui.widgets import forcing


def forced_chips(at) -> list[str]:
    """Texts of the forced chips in the token streams (not the legend), as escaped in the page."""
    streams = [h.value for h in at.html if "data-step=" in h.value]
    return [m for s in streams for m in re.findall(r'class="ds-chip ds-origin-forced[^"]*"[^>]*>([^<]*)', s)]


def branch_shown(at, original_events, forced: list[int]) -> object:
    """The checks every strategy shares: the branch emits exactly `forced` first, is as long as the
    original, is on view with its forced tokens by text, and the original run is untouched."""
    ok(at)
    assert not at.error, [e.value for e in at.error]
    live, branch = run_state(at), at.session_state["ds.branch"]
    assert branch.forced == tuple(forced) and branch.output_ids[:len(forced)] == forced
    assert branch.reach >= live.reach or branch.done
    assert live.events == original_events
    assert at.session_state["pg.view"] == "Branch"
    assert forced_chips(at) == [html.escape(visible(live.lm.piece(t))) for t in forced]
    assert any('class="ds-diverge"' in h.value for h in at.html)
    return branch


def pick_index(choices, live, avoid: int) -> int:
    """Index of the first offered token that is neither `avoid` (the emitted one) nor an EOS."""
    return next(i for i, c in enumerate(choices) if c.token_id != avoid and c.token_id not in live.lm.eos_ids)


def test_force_a_pruned_beam_candidate(tiny_dir):
    at = new_app({"strategy": "beam", "num_beams": "3", "max_new": "5"})
    at.number_input(key="pg.n_steps").set_value(3)
    at.button(key="pg.run_n").click().run()
    ok(at)
    original = list(run_state(at).events)
    step = original[2]
    rank = next(r for r, c in enumerate(step.pool) if c.status == "pruned")
    assert len(at.selectbox(key="pg.force_pick").options) == len(forcing.beam_ranks(step))
    at.selectbox(key="pg.force_pick").set_value(rank)
    at.button(key="pg.force").click().run()
    cand = step.pool[rank]
    forced = list(original[1].beams[cand.source_beam].token_ids) + [cand.token_id]
    branch = branch_shown(at, original, forced)
    assert branch.events[0].forced_ids == tuple(forced)
    at.button(key="pg.adopt_branch").click().run()          # the adopted branch keeps stepping
    ok(at)
    assert run_state(at).forced == tuple(forced)


def test_force_a_target_candidate_in_a_speculative_round(tiny_dir):
    at = new_app({"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "12", "prompt": REPEAT,
                  "chat": "0"})
    run_to_end(at)
    live = run_state(at)
    original = list(live.events)
    at_round = next(i for i, e in enumerate(original) if e.accepted >= 1 and len(forcing.spec_positions(e)) >= 2)
    at.session_state["ds.cursor"] = at_round
    at.run()
    ok(at)
    event = original[at_round]
    k = 1
    at.selectbox(key="pg.force_at").set_value(k).run()
    choices = forcing.spec_choices(event, k)
    i = pick_index(choices, live, event.emitted[k])
    at.selectbox(key="pg.force_pick").set_value(i)
    at.button(key="pg.force").click().run()
    before = sum(len(e.emitted) for e in original[:at_round])
    forced = live.output_ids[:before + k] + [choices[i].token_id]
    branch_shown(at, original, forced)


@pytest.mark.slow
def test_force_a_lattice_candidate_in_a_dspark_round(tiny_dir, drafter_file):
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "top_k_candidates": "2",
                  "max_new": "8"})
    for _ in range(2):
        at.button(key="pg.step").click().run()
    ok(at)
    live = run_state(at)
    original = list(live.events)
    event = original[1]
    depths = forcing.dspark_depths(event)
    d = depths[-1]
    assert at.selectbox(key="pg.force_at").options and len(depths) >= 2
    at.selectbox(key="pg.force_at").set_value(d).run()
    choices = forcing.dspark_choices(event, d)
    i = pick_index(choices, live, event.emitted[d - 1])
    assert "lattice cand" in choices[i].note
    at.selectbox(key="pg.force_pick").set_value(i)
    at.button(key="pg.force").click().run()
    forced = list(original[0].emitted) + list(event.emitted[:d - 1]) + [choices[i].token_id]
    branch = branch_shown(at, original, forced)
    assert branch.events[0].prefill
