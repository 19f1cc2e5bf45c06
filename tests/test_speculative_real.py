"""Temperature 0 on the embedded model: speculative decoding is token-identical to plain greedy (prompt
lookup and an untrained 4-layer early-exit draft), and matches transformers' assisted generation and
prompt lookup in output ids AND number of target forwards."""
from __future__ import annotations

import pytest
from spec_helpers import constant_assistant, divergence, heldout_prompts, hf_generate

from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.drafters.draft_model import truncated_draft

pytestmark = pytest.mark.real

N = 64
PROMPTS = (
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that returns the squares of a list of numbers.",
    "What is the capital of France? Answer in one sentence.",
)


@pytest.fixture(scope="module")
def greedy_runs(real_lm):
    out = {}
    for text in PROMPTS:
        ids = real_lm.encode(text)
        out[text] = (ids, runner.run(real_lm, ids, GreedyConfig(max_new_tokens=N)).output_ids)
    return out


@pytest.fixture(scope="module")
def draft4(real_lm):
    return truncated_draft(real_lm, 4)


@pytest.mark.parametrize("text", PROMPTS)
def test_lookup_is_greedy(real_lm, greedy_runs, text):
    ids, expected = greedy_runs[text]
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N, draft="lookup", gamma=10))
    assert trace.error is None
    assert trace.stats.target_forwards == len(trace.steps)
    assert not divergence(real_lm, ids, expected, trace.output_ids), \
        divergence(real_lm, ids, expected, trace.output_ids)


@pytest.mark.parametrize("text", PROMPTS[:2])
def test_draft_model_is_greedy(real_lm, greedy_runs, draft4, text):
    ids, expected = greedy_runs[text]
    config = SpeculativeConfig(max_new_tokens=N, draft="first4", gamma=2, gamma_policy="heuristic")
    trace = runner.run(real_lm, ids, config, drafter=draft4)
    assert trace.error is None
    assert not divergence(real_lm, ids, expected, trace.output_ids), \
        divergence(real_lm, ids, expected, trace.output_ids)


def parity_prompt(lm) -> list[int]:
    """No chat template: transformers' assistant infers its attention mask from the pad id (2 here,
    also <|im_end|> in the template), which would hide template tokens from the draft's context."""
    ids = lm.encode(PROMPTS[0], chat_template=False)
    assert lm.model.generation_config.pad_token_id not in ids
    return ids


def test_parity_assisted_generation_real(real_lm, draft4):
    ids = parity_prompt(real_lm)
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N // 2, draft="first4", gamma=3),
                       drafter=draft4)
    hf_ids, hf_forwards = hf_generate(real_lm.model, ids, max_new_tokens=N // 2,
                                      assistant_model=constant_assistant(draft4.model, 3))
    assert list(trace.output_ids) == hf_ids, divergence(real_lm, ids, hf_ids, trace.output_ids)
    assert trace.stats.target_forwards == hf_forwards


def test_parity_prompt_lookup_real(real_lm):
    ids = parity_prompt(real_lm)
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N // 2, draft="lookup", gamma=10))
    hf_ids, hf_forwards = hf_generate(real_lm.model, ids, max_new_tokens=N // 2, prompt_lookup_num_tokens=10)
    assert list(trace.output_ids) == hf_ids, divergence(real_lm, ids, hf_ids, trace.output_ids)
    assert trace.stats.target_forwards == hf_forwards
    assert trace.stats.acceptance_rate > 0  # the repeated sentence gives lookup something to copy


def greedy_tau(real_lm, texts, draft: str, drafter, check_trace=None) -> float:
    """Tokens per target forward (prefill excluded) of γ = 5 runs of 64 tokens with `draft`, each checked
    token-identical to greedy (and by `check_trace`)."""
    emitted = forwards = 0
    for text in texts:
        ids = real_lm.encode(text)
        expected = runner.run(real_lm, ids, GreedyConfig(max_new_tokens=N)).output_ids
        trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N, draft=draft, gamma=5), drafter=drafter)
        assert trace.error is None
        assert not divergence(real_lm, ids, expected, trace.output_ids), \
            divergence(real_lm, ids, expected, trace.output_ids)
        if check_trace is not None:
            check_trace(trace)
        emitted += len(trace.output_ids) - 1           # the prefill's token is not a round's
        forwards += trace.stats.target_forwards - 1
    return emitted / forwards


@pytest.fixture(scope="module")
def shallow(real_lm):
    from decoding.drafters.shallow import DEFAULT_SHALLOW, load_shallow

    if not DEFAULT_SHALLOW.is_file():
        pytest.fail(f"shipped shallow-draft weights missing: {DEFAULT_SHALLOW}")
    return load_shallow(real_lm)


def test_shallow_draft_is_greedy_and_accepts(real_lm, greedy_runs, shallow):
    """The shipped shallow draft: identical to greedy on new and held-out prompts, and a real draft:
    tokens per target forward above 1.5 on held-out prompts of its training distribution and above 1.15
    on the new ones (the untrained early exit it starts from gives about 1.05)."""
    held, new = (greedy_tau(real_lm, texts, "shallow", shallow) for texts in (heldout_prompts(2), PROMPTS))
    assert held > 1.5 and new > 1.15, (held, new)


def test_parity_assisted_generation_shallow(real_lm, shallow):
    """The shallow draft is a standard transformers model: as assistant_model it gives transformers'
    assisted generation the same ids and target forwards as ours."""
    ids = parity_prompt(real_lm)
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N // 2, draft="shallow", gamma=5),
                       drafter=shallow)
    hf_ids, hf_forwards = hf_generate(real_lm.model, ids, max_new_tokens=N // 2,
                                      assistant_model=constant_assistant(shallow.model, 5))
    assert list(trace.output_ids) == hf_ids, divergence(real_lm, ids, hf_ids, trace.output_ids)
    assert trace.stats.target_forwards == hf_forwards


@pytest.mark.parametrize("text", PROMPTS)
def test_lookup_then_shallow_is_greedy(real_lm, greedy_runs, shallow, text):
    """Prompt lookup where it matches, the shipped shallow draft elsewhere: identical to greedy; both
    drafters draft on every prompt here, lookup's drafts are accepted on the repeat-this prompt and
    the shallow draft's on the code prompt."""
    ids, expected = greedy_runs[text]
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N, draft="lookup+shallow", gamma=5),
                       drafter=shallow)
    assert trace.error is None
    assert not divergence(real_lm, ids, expected, trace.output_ids), \
        divergence(real_lm, ids, expected, trace.output_ids)
    accepted = {name: sum(r.accepted for r in trace.steps if r.drafter == name) for name in ("lookup", shallow.name)}
    assert {"lookup", shallow.name} <= {r.drafter for r in trace.steps}
    assert accepted[{PROMPTS[0]: "lookup", PROMPTS[1]: shallow.name}.get(text, "lookup")] > 0, accepted


@pytest.mark.parametrize("draft", ["shallow", "lookup+shallow"])
def test_cost_policy_is_greedy(real_lm, greedy_runs, shallow, draft, tmp_path, monkeypatch):
    """gamma_policy 'cost' with a verify table where 4+ tokens are dear (as on the 2-core CPU):
    identical to greedy, and the chosen γ stays at or below 3."""
    from decoding.runtime.cost_table import CostTable

    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))                  # the draft's cost is profiled here
    table = tmp_path / "table.json"
    CostTable(verify_ms=(31.0, 34.5, 36.0, 49.0, 50.0, 53.0, 56.0, 57.0, 63.0)).save(table)
    for text in PROMPTS[:2]:
        ids, expected = greedy_runs[text]
        config = SpeculativeConfig(max_new_tokens=N, draft=draft, gamma=8, gamma_policy="cost", cost_table=str(table))
        trace = runner.run(real_lm, ids, config, drafter=shallow)
        assert trace.error is None
        assert not divergence(real_lm, ids, expected, trace.output_ids), \
            divergence(real_lm, ids, expected, trace.output_ids)
        chosen = [r.gamma_choice.gamma for r in trace.steps if r.gamma_choice is not None]
        assert chosen and max(chosen) <= 3, chosen


@pytest.fixture(scope="module")
def feature(real_lm):
    from decoding.drafters.feature_net import DEFAULT_FEATURE, load_feature

    if not DEFAULT_FEATURE.is_file():
        pytest.fail(f"shipped feature-drafter weights missing: {DEFAULT_FEATURE}")
    return load_feature(real_lm)


def test_feature_drafter_is_greedy_and_accepts(real_lm, feature):
    """The shipped feature drafter: identical to greedy on new and held-out prompts, and a real drafter:
    tokens per target forward above 2.0 on held-out prompts of its training distribution and above 1.4
    on the new ones (the shallow draft: 1.5 / 1.15 in the same test)."""
    def rounds_ok(trace):
        assert not trace.steps[0].drafts and all(r.drafter == feature.name for r in trace.steps[1:])

    held, new = (greedy_tau(real_lm, texts, "feature", feature, rounds_ok) for texts in (heldout_prompts(2), PROMPTS))
    assert held > 2.0 and new > 1.4, (held, new)


@pytest.mark.parametrize("text", PROMPTS)
def test_lookup_then_feature_is_greedy(real_lm, greedy_runs, feature, text):
    ids, expected = greedy_runs[text]
    trace = runner.run(real_lm, ids, SpeculativeConfig(max_new_tokens=N, draft="lookup+feature", gamma=5),
                       drafter=feature)
    assert trace.error is None
    assert not divergence(real_lm, ids, expected, trace.output_ids), \
        divergence(real_lm, ids, expected, trace.output_ids)
    assert feature.name in {r.drafter for r in trace.steps}


def test_feature_drafter_sampled_runs_keep_the_contract(real_lm, feature):
    """At temperature 0.8 with top-p: every draft's q_draft is the drafter's processed probability (in
    (0, 1]) and every emitted token has p_target > 0 after the same processing (the χ² test on tiny models,
    tests/test_speculative_chi2.py, checks the distribution itself)."""
    ids = real_lm.encode(PROMPTS[1])
    config = SpeculativeConfig(max_new_tokens=32, draft="feature", gamma=4, temperature=0.8, top_p=0.9, seed=1)
    trace = runner.run(real_lm, ids, config, drafter=feature)
    assert trace.error is None and len(trace.output_ids) == 32
    drafts = [d for r in trace.steps for d in r.drafts]
    assert drafts and all(d.q_draft is not None and 0 < d.q_draft <= 1 for d in drafts)
    assert any(d.verdict == "accepted" for d in drafts)
