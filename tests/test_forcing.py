"""What "force a candidate and branch" forces, per strategy (ui.widgets.forcing), and the branches LiveRun.fork
makes from it, on tiny models: each forced list is rebuilt here another way, and each branch's output
starts with exactly that list."""
from __future__ import annotations

import pytest
from conftest import make_tiny_llama

from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import without_timings
from decoding.runner import run
from decoding.runtime.models import LM
from ui.views.beam import path_back
from ui.views.chips import Chip, name_forced
from ui.widgets import forcing
from ui.widgets.live import LiveRun

PROMPT = [3, 4, 5, 3, 4, 5, 3]


def _plain(events):
    return [without_timings(e) for e in events]


def _before(live: LiveRun, at: int) -> list[int]:
    """Tokens emitted before event `at`, counted from the output (not from emitted_ids)."""
    n = sum(len(e.emitted) for e in live.events[:at])
    return live.output_ids[:n]


def _branch(live: LiveRun, at: int, forced: list[int]) -> LiveRun:
    branch = live.fork(at, forced)
    branch.extend_to(live.reach)
    assert branch.output_ids[:len(forced)] == forced
    assert branch.trace().forced_ids == tuple(forced)
    assert branch.reach >= live.reach or branch.done
    return branch


# ---------------------------------------------------------------- greedy / sampling

def test_token_fork_keeps_the_steps_before_and_equals_branch(tiny_lm):
    live = LiveRun(tiny_lm, PROMPT, SampleConfig(max_new_tokens=6, top_n=5, temperature=1.2, seed=4))
    live.run_to_end()
    at = 2
    choice = next(c.token_id for c in live.events[at].raw_top if c.token_id != live.events[at].chosen_id)
    forced = forcing.token_forced(live.events, at, choice)
    assert forced == live.output_ids[:at] + [choice]
    branch = _branch(live, at, forced)
    assert branch.events[:at] == live.events[:at]                  # the shared steps are kept as they were
    assert branch.events[at].forced and not any(e.forced for e in branch.events[:at])
    assert _plain(live.branch(at, choice).events) == _plain(branch.events[:at + 1])   # the greedy path's helper
    assert _plain(branch.events[at:]) == _plain(run(tiny_lm, PROMPT, live.config, forced=forced).steps[at:])
    with pytest.raises(ConfigError):
        forcing.token_forced(live.events, len(live.events), choice)


# ---------------------------------------------------------------- beam search

@pytest.fixture(scope="module")
def beam_live(tiny_lm):
    live = LiveRun(tiny_lm, PROMPT, BeamConfig(max_new_tokens=4, num_beams=3))
    live.run_to_end()
    return live


def test_beam_forced_is_the_candidates_hypothesis(beam_live):
    events, at = beam_live.events, 2
    ranks = forcing.beam_ranks(events[at])
    assert ranks and all(events[at].pool[r].status in ("kept", "pruned") for r in ranks)
    for rank in ranks:                   # the tree walk of the beam view gives the same tokens
        path = [events[s].pool[r].token_id for s, r in path_back(events, at, rank)]
        assert forcing.beam_forced(events, at, rank) == path
    rank = next(r for r in ranks if events[at].pool[r].source_beam != 0)
    best_prefix = list(events[at - 1].beams[0].token_ids) + [events[at].pool[rank].token_id]
    assert forcing.beam_forced(events, at, rank) != best_prefix   # negative control: the source beam matters


def test_beam_branch_starts_with_the_hypothesis(beam_live, tiny_lm):
    events, at = beam_live.events, 2
    rank = next(r for r in forcing.beam_ranks(events[at]) if events[at].pool[r].status == "pruned")
    forced = forcing.beam_forced(events, at, rank)
    branch = _branch(beam_live, at, forced)
    assert all(e.forced_ids == tuple(forced) for e in branch.events)
    truth = run(tiny_lm, PROMPT, beam_live.config, forced=forced)
    assert _plain(branch.events) == _plain(truth.steps[:len(branch.events)])
    assert branch.output_ids[:len(forced)] != beam_live.output_ids[:len(forced)]


def test_beam_forced_refuses_finished_and_unknown_candidates(beam_live):
    events = beam_live.events
    finished = [(s, r) for s, e in enumerate(events) for r, c in enumerate(e.pool)
                if c.status not in forcing.FORCEABLE_BEAM]
    assert finished                                     # the last step finalizes its top candidates
    s, r = finished[0]
    with pytest.raises(ConfigError, match="rank="):
        forcing.beam_forced(events, s, r)
    with pytest.raises(ConfigError, match="rank="):
        forcing.beam_forced(events, 0, len(events[0].pool))
    with pytest.raises(ConfigError, match="step="):
        forcing.beam_forced(events, len(events), 0)


# ---------------------------------------------------------------- speculative

@pytest.fixture(scope="module")
def spec_live():
    from spec_helpers import peaked_lm

    target, draft = peaked_lm(0), peaked_lm(1)
    live = LiveRun(target, PROMPT,
                   SpeculativeConfig(draft="lookup", max_new_tokens=16, gamma=3, temperature=1.0, seed=4),
                   strategy_kwargs={"drafter": draft})
    live.run_to_end()
    return live


def _spec_round(live: LiveRun):
    """A round after the first with an accepted draft and a rejection."""
    return next(i for i, e in enumerate(live.events)
                if i > 0 and e.accepted >= 1 and e.final_kind == "residual" and len(forcing.spec_positions(e)) > 1)


def test_spec_choices_at_accepted_and_rejected_positions(spec_live):
    at = _spec_round(spec_live)
    event = spec_live.events[at]
    first = forcing.spec_choices(event, 0)
    assert first[0].token_id == event.emitted[0] == event.drafts[0].token_id and "emitted" in first[0].note
    assert {c.token_id for c in event.drafts[0].target_top} <= {c.token_id for c in first}
    k = event.accepted                                        # the residual resample's position
    last = forcing.spec_choices(event, k)
    ids = [c.token_id for c in last]
    assert ids[0] == event.final_id and event.drafts[k].token_id in ids
    assert {e.token_id for e in event.residual_top} <= set(ids) and len(ids) == len(set(ids))
    assert "rejected" in last[ids.index(event.drafts[k].token_id)].note


def test_spec_branch_emits_the_accepted_prefix_then_the_choice(spec_live):
    at = _spec_round(spec_live)
    event = spec_live.events[at]
    k = 1
    choice = next(c.token_id for c in forcing.spec_choices(event, k) if c.token_id != event.emitted[k])
    forced = forcing.spec_forced(spec_live.events, at, k, choice)
    assert forced == _before(spec_live, at) + list(event.emitted[:k]) + [choice]
    branch = _branch(spec_live, at, forced)
    assert branch.events[0].forced_ids == tuple(forced)
    assert branch.output_ids[:len(forced) - 1] == spec_live.output_ids[:len(forced) - 1]
    assert branch.output_ids[len(forced) - 1] != spec_live.output_ids[len(forced) - 1]


def test_spec_forced_refuses_positions_not_emitted(spec_live):
    at = _spec_round(spec_live)
    event = spec_live.events[at]
    n = len(forcing.spec_positions(event))
    assert n == len(event.emitted) - len(event.forced_ids) <= event.accepted + 1
    with pytest.raises(ConfigError, match="position="):
        forcing.spec_forced(spec_live.events, at, n, 1)
    with pytest.raises(ConfigError, match="position="):
        forcing.spec_choices(event, n)
    with pytest.raises(ConfigError, match="step="):                 # a beam-style rule on a speculative trace
        forcing.beam_forced(spec_live.events, at, 0)


# ---------------------------------------------------------------- DSpark

@pytest.fixture(scope="module")
def dspark_live():
    from dspark_helpers import random_drafter, varied_llama

    lm = varied_llama(seed=0)
    live = LiveRun(lm, PROMPT, DSparkConfig(max_new_tokens=10, gamma=3, top_k_candidates=3),
                   strategy_kwargs={"drafter": random_drafter(lm, gamma_max=3, seed=1)})
    live.run_to_end()
    return live


def test_dspark_choices_are_the_lattice_at_that_depth(dspark_live):
    events = dspark_live.events
    assert forcing.dspark_depths(events[0]) == []                    # the prefill has no lattice
    at = next(i for i, e in enumerate(events) if forcing.dspark_depths(e))
    event = events[at]
    for d in forcing.dspark_depths(event):
        choices = forcing.dspark_choices(event, d)
        assert choices[0].token_id == event.emitted[d - 1] and "emitted" in choices[0].note
        assert {c.token_id for c in event.lattice[d - 1].cells} <= {c.token_id for c in choices}


def test_dspark_branch_emits_the_accepted_path_then_the_choice(dspark_live):
    events = dspark_live.events
    at, d = next((i, e_d) for i, e in enumerate(events) for e_d in forcing.dspark_depths(e)[::-1])
    event = events[at]
    choice = next(c.token_id for c in forcing.dspark_choices(event, d) if c.token_id != event.emitted[d - 1])
    forced = forcing.dspark_forced(events, at, d, choice)
    assert forced == _before(dspark_live, at) + list(event.emitted[:d - 1]) + [choice]
    branch = _branch(dspark_live, at, forced)
    assert branch.events[0].prefill and branch.events[0].forced_ids == tuple(forced)
    with pytest.raises(ConfigError, match="depth="):
        forcing.dspark_forced(events, 0, 1, choice)                  # the prefill
    with pytest.raises(ConfigError, match="depth="):
        forcing.dspark_forced(events, at, 0, choice)


# ---------------------------------------------------------------- refusals and chips

def test_a_forced_eos_ends_the_branch_and_an_empty_list_is_refused():
    lm = LM(make_tiny_llama(eos_token_id=5), tokenizer=None, name="tiny-eos")
    beam_run = LiveRun(lm, PROMPT, BeamConfig(max_new_tokens=3, num_beams=2))
    beam_run.step(1)
    branch = beam_run.fork(0, [7, 5])
    assert branch.done and branch.output_ids == [7, 5]
    greedy = LiveRun(lm, PROMPT, GreedyConfig(max_new_tokens=3))
    greedy.step(2)
    branch = greedy.fork(1, greedy.output_ids[:1] + [5])
    assert branch.done and branch.output_ids == greedy.output_ids[:1] + [5]
    with pytest.raises(ConfigError, match="forced_ids="):
        greedy.fork(0, [])


def test_name_forced_fills_only_placeholder_pieces():
    chips = [Chip("⟨7⟩", "forced", "", 0), Chip("x", "rejected", "", 0, emitted=False), Chip("⟨9⟩", "forced", "", 0),
             Chip("⟨4⟩", "target", "", 1)]
    named = name_forced(chips, [7, 8, 4], {7: "seven", 8: "eight", 4: "four"}.get)
    assert [c.piece for c in named] == ["seven", "x", "⟨9⟩", "⟨4⟩"]   # ⟨9⟩ is not token 8: left alone
