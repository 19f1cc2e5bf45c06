"""dspark end to end on tiny llamas: token-identical to plain greedy at temperature 0 (chain and
tree, several γ/K/budget, random drafters; negative control: a wrong acceptance rule diverges), the
trace's JSON round trip, the stats worked example, cost-aware sizing, and one-line errors."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from dspark_helpers import chain_config, one_thread, random_drafter, varied_llama

from decoding.core import trace
from decoding.core.acceptance import RoundOutcome
from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import DSparkRound, PlanNode
from decoding.drafters.parallel import build_lattice, load_drafter
from decoding.runner import run
from decoding.runtime import cost_table as cost_module
from decoding.runtime.cost_table import CostTable
from decoding.strategies import dspark

PROMPTS = [[1, 2, 3, 4, 5], [9, 40, 17], [33]]
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def drafter(lm):
    return random_drafter(lm, gamma_max=16)


def greedy_ids(lm, prompt, n):
    return run(lm, prompt, GreedyConfig(max_new_tokens=n)).output_ids


@pytest.mark.parametrize("select,gamma,k,budget", [
    ("chain", 1, 1, 1), ("chain", 4, 3, 1), ("chain", 8, 2, 1), ("chain", 16, 4, 1),
    ("tree", 3, 2, 4), ("tree", 8, 3, 12), ("tree", 16, 4, 40)])
@pytest.mark.slow
def test_temperature_zero_equals_greedy(lm, drafter, select, gamma, k, budget):
    for prompt in PROMPTS:
        config = chain_config(max_new_tokens=30, gamma=gamma, top_k_candidates=k, select=select, budget=budget)
        tr = run(lm, prompt, config, drafter=drafter)
        assert tr.error is None
        assert tr.output_ids == greedy_ids(lm, prompt, 30)
        assert tr.stats.target_forwards == len(tr.steps)


def test_rounds_accept_and_reject(lm, drafter):
    """The check above is not vacuous: drafts get both accepted and rejected, and every round
    costs exactly one target forward."""
    tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=40, gamma=4, top_k_candidates=4, select="tree",
                                          budget=10), drafter=drafter)
    verdicts = {n.verdict for e in tr.steps for n in e.nodes}
    assert {"accepted", "rejected"} <= verdicts
    assert all(e.target_forwards == 1 for e in tr.steps)


def test_wrong_acceptance_rule_diverges(lm, drafter, monkeypatch):
    """Negative control: accepting the first child whatever the target says must break equality."""
    def accept_first(tokens, parents, logits):
        kids = [i for i, p in enumerate(parents) if p == 0]
        acc = (kids[0],) if kids else ()
        nxt = int(torch.argmax(logits[acc[-1] if acc else 0]))
        return RoundOutcome(acc, nxt, "bonus", None, (), tuple(tokens[i] for i in acc) + (nxt,))

    monkeypatch.setattr(dspark, "greedy_round", accept_first)
    tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=30, gamma=4, top_k_candidates=2), drafter=drafter)
    assert tr.output_ids != greedy_ids(lm, PROMPTS[0], 30)


def test_eos_and_max_new_tokens(drafter):
    lm_eos = varied_llama(seed=0, eos_token_id=None)
    out = greedy_ids(lm_eos, PROMPTS[0], 30)
    eos = out[7]
    lm_eos = varied_llama(seed=0, eos_token_id=eos)
    d = random_drafter(lm_eos, gamma_max=16)
    ref = run(lm_eos, PROMPTS[0], GreedyConfig(max_new_tokens=30))
    tr = run(lm_eos, PROMPTS[0], chain_config(max_new_tokens=30, gamma=8, top_k_candidates=3), drafter=d)
    assert tr.output_ids == ref.output_ids and tr.output_ids[-1] == eos and tr.stop_reason == "eos"
    for n in (1, 2, 5):
        tr = run(lm_eos, PROMPTS[1], chain_config(max_new_tokens=n, gamma=8), drafter=d)
        assert tr.output_ids == greedy_ids(lm_eos, PROMPTS[1], n)


def test_forced_tokens_come_first(lm, drafter):
    tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=20, gamma=4), drafter=drafter, forced=[7, 8])
    ref = run(lm, PROMPTS[0], GreedyConfig(max_new_tokens=20), forced=[7, 8])
    assert tr.output_ids == ref.output_ids and tr.output_ids[:2] == (7, 8)


def test_trace_json_round_trip(lm, drafter):
    for select in ("chain", "tree"):
        tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=24, gamma=6, top_k_candidates=3, select=select,
                                              budget=9, temperature=0.8, seed=3), drafter=drafter)
        back = trace.from_json(trace.to_json(tr))
        assert back == tr
        rnd = tr.steps[1]
        assert isinstance(rnd, DSparkRound) and rnd.lattice and rnd.nodes
        assert set(rnd.timings_ms) >= {"drafter", "dp", "verification", "acceptance", "cache"}
        assert (rnd.dp is not None) == (select == "chain")


def test_seeded_runs_repeat_without_timings(lm, drafter):
    config = chain_config(max_new_tokens=20, gamma=5, top_k_candidates=3, select="tree", budget=8,
                          temperature=1.0, top_k=20, seed=11)
    first, second = (run(lm, PROMPTS[0], config, drafter=drafter) for _ in range(2))
    assert trace.without_timings(first) == trace.without_timings(second)
    other = run(lm, PROMPTS[0], dataclasses.replace(config, seed=12), drafter=drafter)
    assert trace.without_timings(other) != trace.without_timings(first)


def test_trace_records_the_dp_path(lm, drafter):
    tr = run(lm, PROMPTS[1], chain_config(max_new_tokens=12, gamma=5, top_k_candidates=3), drafter=drafter)
    rnd = tr.steps[1]
    assert tuple(n.cand for n in rnd.nodes) == rnd.dp.path
    assert [n.token_id for n in rnd.nodes] == [rnd.lattice[k].cells[j].token_id for k, j in enumerate(rnd.dp.path)]
    assert rnd.expected_accepted == pytest.approx(max(rnd.dp.values[0][0]))


def test_stats_worked_example():
    """Two rounds: depth-3 chain accepting 2 (emits 3), depth-2 chain accepting 0 (emits 1).
    τ = 4/2, acceptance = 2/5, per position = (1/2, 1/2, 0/1)."""
    def node(i, depth, verdict):
        return PlanNode(i, i - 1, depth, 0, 5, "x", 0.5, 0.5, 0.5, 0.5, None, verdict)

    def rnd(index, nodes, accepted, emitted, prefill=False):
        return DSparkRound(index, 10, prefill, "chain", (), None, tuple(nodes), 0.0, None, accepted, 5,
                           "bonus", None, emitted)

    events = [rnd(0, [], (), (4,), prefill=True),
              rnd(1, [node(1, 1, "accepted"), node(2, 2, "accepted"), node(3, 3, "rejected")], (1, 2), (5, 5, 5)),
              rnd(2, [node(1, 1, "rejected"), node(2, 2, "not_reached")], (), (6,))]
    stats = dspark.dspark_stats(events)
    assert stats == {"mean_accepted_length": 2.0, "acceptance_rate": 0.4,
                     "per_position_acceptance": (0.5, 0.5, 0.0)}


def test_cost_aware_chain_length(lm, drafter, tmp_path):
    """A table where each extra verified token costs a lot picks short chains; a flat one picks γ."""
    steep = tmp_path / "steep.json"
    CostTable(verify_ms=tuple(10.0 * n ** 4 for n in range(1, 18)), source="test").save(steep)
    flat = tmp_path / "flat.json"
    CostTable(verify_ms=(10.0,) * 17, source="test").save(flat)
    ref = greedy_ids(lm, PROMPTS[0], 20)
    for path, expect in ((steep, 1), (flat, 8)):
        tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=20, gamma=8, top_k_candidates=2,
                                              cost_table=str(path)), drafter=drafter)
        assert tr.output_ids == ref
        sizes = [e.size.size for e in tr.steps[1:] if e.size is not None]
        assert sizes and (max(sizes) == 1 if expect == 1 else sizes[0] == 8)
        assert tr.steps[1].size.verify_ms[0] == 10.0 and tr.steps[1].size.cost_source == path.name
        assert tr.config["cost_table"] == path.name and str(tmp_path) not in trace.to_json(tr)


def test_auto_cost_table_is_profiled_once_and_cached(lm, drafter, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    calls = []
    real = cost_module.profile_verify_cost
    monkeypatch.setattr(cost_module, "profile_verify_cost", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    config = chain_config(max_new_tokens=12, gamma=4, top_k_candidates=2, cost_table="auto")
    first = run(lm, PROMPTS[0], config, drafter=drafter)
    second = run(lm, PROMPTS[0], config, drafter=drafter)
    assert len(calls) == 1 and cost_module.auto_cost_path(lm).is_file()
    assert first.output_ids == second.output_ids == greedy_ids(lm, PROMPTS[0], 12)
    assert second.steps[1].size.cost_source == "auto: " + cost_module.auto_cost_path(lm).name
    assert str(tmp_path) not in trace.to_json(second)          # a trace a user downloads names no server folder
    assert first.steps[1].size.verify_ms == second.steps[1].size.verify_ms
    overhead = first.steps[1].size.overhead_ms          # the drafter's round, timed once on the first run
    sized = [e.size for e in list(first.steps[1:]) + list(second.steps[1:]) if e.size is not None]
    assert overhead > 0 and len(sized) > 2 and all(s.overhead_ms == overhead for s in sized)


def test_an_auto_table_cached_before_the_fit_is_read_non_decreasing(lm, tmp_path, monkeypatch):
    """A table profiled by an older version (a busy moment: 4 tokens cheaper than 3) is pooled when read."""
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    noisy = (100.0, 160.0, 171.0, 138.0) + tuple(180.0 + n for n in range(14))
    cost_module.save_auto(cost_module.CostTable(verify_ms=noisy), cost_module.auto_cost_path(lm))
    read = cost_module.load_table(lm, "auto", 8)
    assert read.verify_ms[:4] == pytest.approx((100.0, 469 / 3, 469 / 3, 469 / 3)) and read.verify_ms[4:] == noisy[4:]
    assert cost_module.CostTable.load(cost_module.auto_cost_path(lm)).verify_ms == noisy   # control: the file as it was


def test_round_overhead_prices_every_size_and_favours_larger_ones(lm, drafter, tmp_path):
    """With a round overhead every size costs verify(size + 1) + overhead, which makes larger sizes
    relatively cheaper: the chosen sizes grow, the output stays greedy's. A file without the field has
    none (negative control: the same table without it chooses smaller sizes)."""
    verify = tuple(10.0 + 4.0 * n for n in range(1, 18))
    plain, heavy = tmp_path / "plain.json", tmp_path / "heavy.json"
    CostTable(verify_ms=verify).save(plain)
    CostTable(verify_ms=verify, overhead_ms=200.0).save(heavy)
    ref = greedy_ids(lm, PROMPTS[0], 20)
    sizes = {}
    for path in (plain, heavy):
        tr = run(lm, PROMPTS[0], chain_config(max_new_tokens=20, gamma=8, top_k_candidates=2, cost_table=str(path)),
                 drafter=drafter)
        assert tr.output_ids == ref
        rounds = [e for e in tr.steps[1:] if e.size is not None]
        for e in rounds:
            rates = [1000 * (1 + x) / (verify[n] + e.size.overhead_ms)
                     for n, x in enumerate(e.size.expected_accepted, 1)]
            assert e.size.tokens_per_s == pytest.approx(tuple(rates))
        sizes[path.stem] = [e.size.size for e in rounds]
    assert sum(sizes["heavy"]) > sum(sizes["plain"]), sizes


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "3"])
def test_bad_round_overhead_is_one_line(value, tmp_path):
    with pytest.raises(ConfigError) as err:
        CostTable(verify_ms=(1.0, 2.0), overhead_ms=value)
    assert err.value.param == "overhead_ms" and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [-2.0, True, "3", None, [1.0]])
def test_bad_round_overhead_in_a_file_names_the_file(value, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": 1, "verify_ms": [1.0], "overhead_ms": value}))
    with pytest.raises(ConfigError, match=r"cost_table=.*bad.json.*overhead_ms must be a number of milliseconds"):
        CostTable.load(path)


def test_lattice_scores_depend_on_the_parent(lm, drafter):
    hidden = torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    lat = build_lattice(drafter, hidden, 5, 4, 3).lattice
    assert lat.gamma == 4 and all(len(t) == 3 for t in lat.token_ids)
    assert any(lat.scores[k][0] != lat.scores[k][1] for k in range(1, 4))


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs,param", [
    ({"gamma": 17}, "gamma"), ({"gamma": 0}, "gamma"), ({"top_k_candidates": 0}, "top_k_candidates"),
    ({"budget": 0}, "budget"), ({"select": "beam"}, "select"),
    ({"lossy_threshold": 1.5, "temperature": 1.0}, "lossy_threshold"),
    ({"lossy_threshold": 0.3, "temperature": 0.0}, "lossy_threshold")])
def test_bad_config_is_one_line(kwargs, param):
    with pytest.raises(ConfigError) as err:
        DSparkConfig(**kwargs)
    assert err.value.param == param and "\n" not in str(err.value)


def test_missing_drafter_weights(lm, tmp_path):
    with pytest.raises(ConfigError) as missing:     # bad input, refused before the first step (decode resolves it)
        run(lm, PROMPTS[0], chain_config(drafter=str(tmp_path / "nope.safetensors")))
    assert str(missing.value).startswith("drafter=") and "\n" not in str(missing.value)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="could not be read"):
        load_drafter(bad)


def test_gamma_beyond_drafter_and_short_cost_table(lm, tmp_path):
    small = random_drafter(lm, gamma_max=4)
    with pytest.raises(ConfigError, match="^gamma=5 "):       # bad input: refused before the first step
        run(lm, PROMPTS[0], chain_config(gamma=5), drafter=small)
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"version": 1, "verify_ms": [1.0, 2.0]}))
    tr = run(lm, PROMPTS[0], chain_config(gamma=4, cost_table=str(short)), drafter=small)
    assert tr.error.startswith("cost_table=") and "covers 2 tokens" in tr.error


def test_saved_drafter_reloads_identically(lm, drafter, tmp_path):
    path = tmp_path / "d.safetensors"
    drafter.save(path, meta={"note": "test"})
    again = load_drafter(path, lm)
    assert again.meta == {"note": "test"}
    tr_a = run(lm, PROMPTS[0], chain_config(max_new_tokens=16, gamma=6), drafter=drafter)
    tr_b = run(lm, PROMPTS[0], chain_config(max_new_tokens=16, gamma=6, drafter=str(path)))
    assert tr_a.output_ids == tr_b.output_ids


def _head_rows(lm, call) -> list[int]:
    """Rows the target's LM head produced in each of its calls during call()."""
    rows = []
    hook = lm.model.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(out.shape[-2]))
    try:
        call()
    finally:
        hook.remove()
    return rows


def test_prefill_computes_the_last_row_of_logits_only(lm, drafter):
    """The prefill needs one row of logits (the first free token) and the head input at the last
    position: a (prompt, vocabulary) logits block would be the run's largest allocation."""
    prompt = PROMPTS[0]
    rows = _head_rows(lm, lambda: run(lm, prompt, chain_config(max_new_tokens=6, gamma=2), drafter=drafter))
    assert rows[0] == 1 and len(rows) >= 2
    # negative control: the probe sees every row when all positions' logits are asked for
    with torch.inference_mode():
        assert _head_rows(lm, lambda: lm.forward(prompt, lm.new_cache())) == [len(prompt)]


def _largest_cpu_allocation(call) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    return max((ev.cpu_memory_usage for ev in prof.events()), default=0)


def test_drafter_forward_does_not_copy_its_position_weights(lm, drafter):
    """Every drafting round runs the drafter once; its per-position trunk weights (γ_max, D, W) are
    read in place, not copied into another layout per call (8 MiB a round for the shipped drafter)."""
    if drafter.w1.device.type != "cpu":
        pytest.skip("CPU allocation probe")
    w1_bytes = drafter.w1.numel() * drafter.w1.element_size()
    hidden, root = torch.randn(1, drafter.shape.hidden_size), torch.tensor([3])
    with torch.inference_mode():
        out = drafter(hidden, root)
        assert _largest_cpu_allocation(lambda: drafter(hidden, root)) < w1_bytes
        u = F.silu(torch.cat([F.rms_norm(hidden, (hidden.shape[-1],)),
                              F.rms_norm(drafter.embed_tokens(root), (hidden.shape[-1],))], -1)
                   @ drafter.trunk_in + drafter.trunk_b)
        mid = F.silu(torch.einsum("bd,gdw->bgw", u, drafter.w1) + drafter.b1)
        assert torch.equal(out.z, hidden[:, None, :] + torch.einsum("bgw,gwh->bgh", mid, drafter.w2))
        # negative control: the probe sees the copy einsum makes of w1
        assert _largest_cpu_allocation(lambda: torch.einsum("bd,gdw->bgw", u, drafter.w1)) >= w1_bytes
