"""Beam search: exact parity with transformers' generate(num_beams=B), negative controls that must break
parity, and the structure / JSON round trip of beam traces."""
from __future__ import annotations

import collections
import itertools

import pytest
import torch
from conftest import make_tiny_llama

from decoding import runner
from decoding.core.config import BeamConfig, GreedyConfig
from decoding.core.trace import BEAM_STATUSES, from_json, to_json
from decoding.runtime.models import LM
from decoding.strategies import beam

TINY_PROMPT = [3, 7, 9, 11]
TINY_GRID = list(itertools.product((1, 2, 4), (0.5, 1.0, 2.0), (False, True)))
TINY_N = 16
# without an EOS id every hypothesis has the same length, so length penalty and early stopping change
# nothing: the beam widths suffice there
TINY_GRIDS = {1: TINY_GRID, None: [(num_beams, 1.0, False) for num_beams in (1, 2, 4)]}


def _sharp_tiny(eos: int = 1, scale: float = 3.0, seed: int = 0) -> LM:
    """A tiny random llama with its weight matrices scaled up so distributions are peaked enough for
    EOS to be chosen, pruned and dropped (a plain random init is nearly uniform)."""
    model = make_tiny_llama(seed=seed, eos_token_id=eos)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(scale)
    return LM(model, tokenizer=None, name="tiny-sharp")


@pytest.fixture(scope="module")
def sharp_lms():
    return {eos: _sharp_tiny(eos=eos) for eos in (1, None)}


@pytest.fixture(scope="module")
def sharp_lm(sharp_lms):
    return sharp_lms[1]


@pytest.fixture(scope="module")
def tiny_generated(sharp_lms):
    """generate's outputs on the tiny grid, computed once per model."""
    return {eos: {case: theirs(lm, TINY_PROMPT, case, TINY_N) for case in TINY_GRIDS[eos]}
            for eos, lm in sharp_lms.items()}


def _config(num_beams, length_penalty, early_stopping, max_new_tokens):
    return BeamConfig(max_new_tokens=max_new_tokens, num_beams=num_beams, length_penalty=length_penalty,
                      early_stopping=early_stopping)


def ours(lm, ids, case, max_new_tokens, **private) -> list[int]:
    events = list(beam._decode(lm, ids, _config(*case, max_new_tokens), **private))
    return beam.output_ids(events)


def theirs(lm, ids, case, max_new_tokens) -> list[int]:
    num_beams, length_penalty, early_stopping = case
    prompt = torch.tensor([ids], dtype=torch.long, device=lm.device)  # (1, T)
    out = lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=num_beams,
                            do_sample=False, length_penalty=length_penalty, early_stopping=early_stopping,
                            max_new_tokens=max_new_tokens)
    return out[0, len(ids):].tolist()


def _normalized_score(lm, ids, new, length_penalty) -> float:
    """Summed log-prob of `new` after `ids` by one full forward, / len(new) ** length_penalty."""
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids + new], device=lm.device)).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1)  # (N, V)
    total = float(logp.gather(1, torch.tensor(new, device=lm.device)[:, None]).sum())
    return total / len(new) ** length_penalty


def assert_parity(lm, ids, case, max_new_tokens, mine, generated):
    """Equal ids, or a divergence shown to be a numerical tie of the two final scores (printed)."""
    if mine == generated:
        return
    length_penalty = case[1]
    score_mine = _normalized_score(lm, ids, mine, length_penalty)
    score_gen = _normalized_score(lm, ids, generated, length_penalty)
    gap = score_mine - score_gen
    print(f"beam {case} diverged: ours {score_mine:.7f} vs generate {score_gen:.7f}, gap {gap:.2e}")
    assert abs(gap) < 1e-5, f"{case}: not a numerical tie (gap {gap:.3e}); ours {mine} vs {generated}"


# ---------------------------------------------------------------- tiny model: parity and controls

@pytest.mark.parametrize("eos", [1, None])
@pytest.mark.slow
def test_tiny_parity_with_generate(sharp_lms, tiny_generated, eos):
    lm = sharp_lms[eos]
    for case in TINY_GRIDS[eos]:
        mine = ours(lm, TINY_PROMPT, case, TINY_N)
        assert_parity(lm, TINY_PROMPT, case, TINY_N, mine, tiny_generated[eos][case])


def test_tiny_grid_exercises_every_rule(sharp_lm):
    """The parity grid is not vacuous: EOS is finalized, dropped and pruned, and runs end early."""
    statuses, lengths = collections.Counter(), set()
    for case in TINY_GRID:
        events = list(beam._decode(sharp_lm, TINY_PROMPT, _config(*case, TINY_N)))
        statuses.update(c.status for e in events for c in e.pool)
        lengths.add(len(events))
    assert set(statuses) == set(BEAM_STATUSES)
    assert min(lengths) < TINY_N and TINY_N in lengths


@pytest.mark.parametrize("private", [{"_count_prompt": True}, {"_pool_factor": 1}],
                         ids=["prompt-in-length", "pool-of-B"])
def test_tiny_negative_controls_break_parity(sharp_lm, tiny_generated, private):
    differs = [case for case in TINY_GRID if case[0] > 1
               and ours(sharp_lm, TINY_PROMPT, case, TINY_N, **private) != tiny_generated[1][case]]
    assert differs, f"control {private} matched generate everywhere: the parity check has no power"


# ---------------------------------------------------------------- tiny model: trace structure

def _check_step(event, previous_beams, config, pool_size, device=None):
    device = device or torch.device("cpu")
    assert len(event.pool) == pool_size
    scores = [c.score for c in event.pool]
    assert scores == sorted(scores, reverse=True)
    for rank, cand in enumerate(event.pool):
        if cand.status in ("finished", "finished_dropped"):
            assert rank < config.num_beams
        if cand.status == "eos_not_top":
            assert rank >= config.num_beams and cand.token_id == 1
        if event.index == 0:
            assert cand.source_beam == 0          # only beam 0 is live at the first step
        else:
            assert 0 <= cand.source_beam < len(previous_beams)
    kept = [c for c in event.pool if c.status == "kept"]
    assert len(kept) == len(event.beams)
    assert len(event.beams) == config.num_beams or (event.done and not event.beams)
    for live in event.beams:
        parent_ids = previous_beams[live.parent].token_ids if previous_beams else ()
        assert live.token_ids == parent_ids + (live.token_id,)
    norm = [h.normalized_score for h in event.finished]
    assert norm == sorted(norm, reverse=True) and len(norm) <= config.num_beams
    for hyp in event.finished:
        # the engine's own operation on the model's device (a GPU divides by a scalar through its reciprocal)
        expected = torch.tensor(hyp.score, device=device) / (len(hyp.token_ids) ** config.length_penalty)
        assert hyp.normalized_score == float(expected)


@pytest.mark.parametrize("case", [(2, 1.0, False), (3, 0.5, True), (4, 2.0, False)])
def test_trace_structure(sharp_lm, case):
    config = _config(*case, 16)
    events = list(beam._decode(sharp_lm, TINY_PROMPT, config))
    previous = ()
    for event in events:
        _check_step(event, previous, config, pool_size=2 * config.num_beams, device=sharp_lm.device)
        assert event.target_forwards == 1 and event.position == len(TINY_PROMPT) + event.index
        assert {"processing", "cache", "other"} <= set(event.timings_ms)
        previous = event.beams
    assert [e.done for e in events] == [False] * (len(events) - 1) + [True]
    assert [e.early_stop for e in events][:-1] == [False] * (len(events) - 1)
    assert events[-1].finished


def test_cumulative_scores_add_up(sharp_lm):
    events = list(beam._decode(sharp_lm, TINY_PROMPT, _config(3, 1.0, False, 8)))
    for before, after in zip(events, events[1:]):
        for cand in after.pool:
            parent = before.beams[cand.source_beam].score
            assert cand.score == float(torch.tensor(parent) + torch.tensor(cand.logprob))


def test_json_round_trip(sharp_lm):
    trace = runner.run(sharp_lm, TINY_PROMPT, _config(3, 1.0, True, 12))
    assert trace.strategy == "beam" and trace.steps
    assert from_json(to_json(trace)) == trace
    assert trace.stats.target_forwards == len(trace.steps)
    assert list(trace.output_ids) == list(trace.steps[-1].finished[0].token_ids)


def test_bad_status_refused():
    from decoding.core.trace import BeamCandidate, TraceFormatError

    with pytest.raises(TraceFormatError, match="status"):
        BeamCandidate(0, 1, "<1>", -1.0, -1.0, -1.0, "maybe")


@pytest.mark.parametrize("eos", [1, None])
def test_one_beam_equals_greedy(sharp_lms, eos):
    lm = sharp_lms[eos]
    for prompt in (TINY_PROMPT, [5], [40, 2, 33, 8, 17]):
        greedy = runner.run(lm, prompt, GreedyConfig(max_new_tokens=20)).output_ids
        one = runner.run(lm, prompt, BeamConfig(max_new_tokens=20, num_beams=1)).output_ids
        assert one == greedy


def test_forced_prefix_is_context_and_leads_output(sharp_lm):
    config = _config(2, 1.0, False, 10)
    forced = [20, 21]
    with_forced = runner.run(sharp_lm, TINY_PROMPT, config, forced=forced)
    plain = runner.run(sharp_lm, TINY_PROMPT + forced, config)
    assert list(with_forced.output_ids) == forced + list(plain.output_ids)


def test_context_end_stops_search(sharp_lms):
    lm = sharp_lms[None]
    prompt = list(range(2, 62)) * 4 + [5, 6, 7]            # 243 tokens of a 256-token context
    events = list(beam._decode(lm, prompt, _config(2, 1.0, False, 40)))
    assert len(events) == 256 - len(prompt) and events[-1].done
    assert all(len(h.token_ids) <= 13 for h in events[-1].finished)


# ---------------------------------------------------------------- embedded model: parity

REAL_N = 32
REAL_CASES = [  # (prompt, (num_beams, length_penalty, early_stopping)); short answers end in EOS
    ("What is 2+2?", (2, 1.0, False)),
    ("What is 2+2?", (4, 2.0, False)),
    ("Name a color.", (2, 1.0, False)),
    ("Name a color.", (4, 0.5, True)),
    ("What is 2+2?", (4, 0.5, True)),
    ("Write a haiku about the sea.", (2, 2.0, True)),
]
# cases where both wrong rules were seen to change the output (measured once at REAL_N = 32)
CONTROL_CASES = REAL_CASES[1:3]


@pytest.fixture(scope="module")
def generated(real_lm):
    """generate's outputs for every real case, computed once."""
    out = {}
    for text, case in REAL_CASES:
        ids = real_lm.encode(text)
        out[(text, case)] = theirs(real_lm, ids, case, REAL_N)
    return out


@pytest.mark.real
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("text,case", REAL_CASES, ids=[f"{t[:8]}-{c}" for t, c in REAL_CASES])
def test_real_parity_with_generate(real_lm, generated, text, case):
    ids = real_lm.encode(text)
    assert_parity(real_lm, ids, case, REAL_N, ours(real_lm, ids, case, REAL_N), generated[(text, case)])


@pytest.mark.real
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("private", [{"_count_prompt": True}, {"_pool_factor": 1}],
                         ids=["prompt-in-length", "pool-of-B"])
def test_real_negative_controls_break_parity(real_lm, generated, private):
    differs = []
    for text, case in CONTROL_CASES:
        ids = real_lm.encode(text)
        if ours(real_lm, ids, case, REAL_N, **private) != generated[(text, case)]:
            differs.append((text, case))
    assert differs, f"control {private} matched generate on every case: the parity check has no power"
