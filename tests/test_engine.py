"""Engine behaviour on tiny random llamas: seeding, sampling frequencies (chi-squared with a negative
control), resume from a prefix, KV-cache decoding vs full recomputation, stop rules."""
import pytest
import torch
from conftest import logit_atol, make_tiny_llama
from scipy.stats import chisquare

from decoding import runner
from decoding.core import trace
from decoding.core.config import GreedyConfig, SampleConfig
from decoding.core.processors import build_pipeline
from decoding.core.token_step import sample_inverse_cdf
from decoding.runtime.models import LM

PROMPT = [1, 7, 3, 9]
ALPHA = 0.001


def test_sampling_reproducible_with_seed(tiny_lm):
    cfg = SampleConfig(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=11)
    a, b = runner.run(tiny_lm, PROMPT, cfg), runner.run(tiny_lm, PROMPT, cfg)
    assert trace.without_timings(a) == trace.without_timings(b)
    c = runner.run(tiny_lm, PROMPT, SampleConfig(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=12))
    assert c.output_ids != a.output_ids


def _processed_probs(lm, params):
    logits = lm.forward(PROMPT, lm.new_cache())[-1]
    return build_pipeline(**params)(logits).softmax(-1)  # (V,)


def _chi2_pvalue(counts, probs, n):
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token with probability 0"
    expected = probs[support].double() / probs[support].double().sum() * counts.sum().double()
    return chisquare(counts[support].double().cpu().numpy(), expected.cpu().numpy()).pvalue


PARAMS = {"temperature": 1.5, "top_k": 20, "top_p": 0.9, "min_p": 0.02}


@pytest.mark.slow
def test_inverse_cdf_frequencies_match_processed_distribution(tiny_lm):
    """n = 40,000 draws at alpha = 0.001; the two negative controls below show the test rejects
    wrong samplers at this n."""
    probs = _processed_probs(tiny_lm, PARAMS)
    g = torch.Generator().manual_seed(0)
    n = 40_000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[sample_inverse_cdf(probs, g)[0]] += 1
    assert _chi2_pvalue(counts, probs, n) > ALPHA


@pytest.mark.slow
def test_end_to_end_first_token_frequencies(tiny_lm):
    probs = _processed_probs(tiny_lm, PARAMS)
    n = 800
    counts = torch.zeros_like(probs)
    for seed in range(n):
        tr = runner.run(tiny_lm, PROMPT, SampleConfig(max_new_tokens=1, seed=seed, top_n=1, **PARAMS))
        counts[tr.output_ids[0]] += 1
    assert _chi2_pvalue(counts, probs, n) > ALPHA


@pytest.mark.slow
def test_negative_control_unprocessed_sampling_fails_chi2(tiny_lm):
    """Sampling from the raw (unfiltered, temperature-1) distribution must be rejected by the same test."""
    probs = _processed_probs(tiny_lm, PARAMS)
    raw = tiny_lm.forward(PROMPT, tiny_lm.new_cache())[-1].softmax(-1)
    g = torch.Generator().manual_seed(0)
    n = 40_000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[sample_inverse_cdf(raw, g)[0]] += 1
    support = probs > 0
    leaked = counts[~support].sum() > 0
    assert leaked or _chi2_pvalue(counts, probs, n) < ALPHA


@pytest.mark.slow
def test_negative_control_off_by_one_cdf_fails_chi2(tiny_lm):
    probs = _processed_probs(tiny_lm, PARAMS)
    order = torch.argsort(probs, descending=True)
    g = torch.Generator().manual_seed(0)
    n = 40_000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        idx = sample_inverse_cdf(probs[order], g)[0]
        counts[order[max(idx - 1, 0)]] += 1  # wrong: shifted one bucket
    assert _chi2_pvalue(counts, probs, n) < ALPHA


@pytest.mark.parametrize("cfg", [GreedyConfig(max_new_tokens=16),
                                 SampleConfig(max_new_tokens=16, temperature=1.2, top_k=30, seed=5)])
@pytest.mark.parametrize("k", [1, 5, 15])
def test_resume_from_prefix_equals_continuation(tiny_lm, cfg, k):
    full = runner.run(tiny_lm, PROMPT, cfg)
    resumed = runner.run(tiny_lm, PROMPT, cfg, forced=full.output_ids[:k])
    assert resumed.output_ids == full.output_ids
    strip = trace.without_timings
    assert strip(resumed)["steps"][k:] == strip(full)["steps"][k:]
    assert all(s.forced for s in resumed.steps[:k]) and not any(s.forced for s in resumed.steps[k:])


def test_branch_changes_the_rest(tiny_lm):
    cfg = GreedyConfig(max_new_tokens=10)
    full = runner.run(tiny_lm, PROMPT, cfg)
    other = full.steps[2].raw_top[1].token_id
    branch = runner.run(tiny_lm, PROMPT, cfg, forced=list(full.output_ids[:2]) + [other])
    assert branch.output_ids[:3] == full.output_ids[:2] + (other,)


def _full_recompute_logits(lm, ids):
    with torch.inference_mode():
        return lm.model(torch.tensor([ids], device=lm.device)).logits[0, -1].float()  # (V,)


@pytest.mark.parametrize("which", ["tiny", "real"])
@pytest.mark.slow
def test_kv_cache_equals_full_recomputation(which, tiny_lm, request):
    """Every step's raw logits (from the KV-cached loop) equal a cache-free forward over the whole
    prefix, within 1e-4 absolute (fp32; observed differences are ~1e-5 on the real model)."""
    lm = tiny_lm if which == "tiny" else request.getfixturevalue("real_lm")
    prompt = PROMPT if which == "tiny" else lm.encode("Name three colours.")
    tr = runner.run(lm, prompt, GreedyConfig(max_new_tokens=12, top_n=3))
    ids = list(prompt)
    for step in tr.steps:
        full = _full_recompute_logits(lm, ids)
        top_ids = [c.token_id for c in step.raw_top]
        cached = torch.tensor([c.logit for c in step.raw_top])
        assert torch.allclose(cached, full[top_ids].cpu(), atol=logit_atol(1e-4)), step.index
        ids.append(step.chosen_id)


def test_stops_on_eos():
    model = make_tiny_llama(seed=1)
    probe = LM(model, None, "tiny-eos")
    first = runner.run(probe, PROMPT, GreedyConfig(max_new_tokens=3)).output_ids
    model.generation_config.eos_token_id = first[1]
    lm = LM(model, None, "tiny-eos")
    tr = runner.run(lm, PROMPT, GreedyConfig(max_new_tokens=10))
    cut = first.index(first[1]) + 1
    assert tr.output_ids == first[:cut] and tr.stop_reason == "eos"


def test_stop_callback_keeps_trace(tiny_lm):
    seen = []
    tr = runner.run(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=50), on_event=seen.append,
                    should_stop=lambda: len(seen) >= 4)
    assert tr.stop_reason == "stopped" and len(tr.output_ids) == 4 and len(tr.steps) == 4


def test_timings_recorded(tiny_lm):
    tr = runner.run(tiny_lm, PROMPT, SampleConfig(max_new_tokens=3, top_k=5))
    assert set(tr.steps[0].timings_ms) >= {"prefill", "processing", "sampling", "other"}
    assert set(tr.steps[1].timings_ms) >= {"forward", "processing", "sampling", "other"}
    assert all(v >= 0 for s in tr.steps for v in s.timings_ms.values())
