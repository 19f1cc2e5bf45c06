"""DSpark with the feature drafter as a sequential head (decoding.drafters.feature_lattice) on tiny
llamas: token-identical to plain greedy at temperature 0 (chain, tree, with prompt lookup); the
target's distribution at temperature 0.8 (χ², the lossy mode as negative control); stopping early
never changes the best tree of a budget (negative control: a looser stop does); the lattice's parts;
the calibration's fit and ECE on known data."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
from dspark_helpers import one_thread, random_head, varied_llama
from sampling_support import VOCAB, pvalues

from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.core.lattice import LatticeRequest
from decoding.drafters import feature_lattice
from decoding.drafters.feature_lattice import HeadCalibration
from decoding.runner import run
from decoding.strategies.dspark_select import best_tree
from decoding.train.head_calibration import ece, fit_platt

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
PROMPTS = [[1, 2, 3, 4, 5], [9, 40, 17, 9, 40], [33]]


@pytest.fixture(scope="module")
def head(lm):
    return random_head(lm, floor=0.02)     # the floor of its recorded runs: a random head survives poorly


@pytest.mark.parametrize("select,gamma,k,budget,lookup,cost", [
    ("chain", 1, 1, 1, 0, "none"), ("chain", 6, 3, 1, 0, "none"), ("chain", 8, 2, 1, 2, "none"),
    ("tree", 4, 2, 5, 0, "none"), ("tree", 8, 3, 12, 0, "none"), ("tree", 12, 4, 24, 2, "none"),
    ("tree", 8, 3, 8, 2, "auto"), ("chain", 8, 3, 1, 2, "auto")])
@pytest.mark.slow
def test_temperature_zero_equals_greedy(lm, head, select, gamma, k, budget, lookup, cost):
    for prompt in PROMPTS:
        config = DSparkConfig(max_new_tokens=30, gamma=gamma, top_k_candidates=k, select=select, budget=budget,
                              lookup_max_ngram=lookup, cost_table=cost)
        tr = run(lm, prompt, config, drafter=head)
        assert tr.error is None
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        assert tr.stats.target_forwards == len(tr.steps)


def test_drafts_are_accepted_and_rejected(lm, head):
    """The identity above is not vacuous: nodes of both verdicts, and rounds that emit several tokens."""
    verdicts, emitted = set(), []
    for prompt in PROMPTS:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=40, gamma=6, top_k_candidates=4, select="tree",
                                          budget=12, lookup_max_ngram=2, cost_table="none"), drafter=head)
        verdicts |= {n.verdict for e in tr.steps for n in e.nodes}
        emitted += [len(e.emitted) for e in tr.steps if not e.prefill]
    assert {"accepted", "rejected"} <= verdicts and max(emitted) >= 3


@pytest.fixture(scope="module")
def small_lm():
    return varied_llama(seed=2, vocab=VOCAB, init=0.1)


@pytest.mark.parametrize("select,k,budget", [("chain", 3, 1), ("tree", 3, 5)])
@pytest.mark.slow
def test_sampling_follows_the_target(small_lm, select, k, budget):
    head = random_head(small_lm, seed=3)
    values = pvalues(small_lm, head, select=select, top_k_candidates=k, budget=budget, lookup_max_ngram=1)
    assert min(values) > 1e-3, values


@pytest.mark.slow
def test_lossy_mode_fails_the_same_test(small_lm):
    head = random_head(small_lm, seed=3)
    values = pvalues(small_lm, head, select="tree", top_k_candidates=3, budget=5, lossy_threshold=0.05)
    assert min(values[1:]) < 1e-6, values


# ------------------------------------------------------------------ the lattice
def _anchor(lm, seed: int) -> tuple[torch.Tensor, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, int(lm.model.config.hidden_size), generator=gen), [int(seed % lm.vocab_size)]


def _plan(tree):
    return [(n.depth, n.token, n.parent) for n in tree.nodes]


def test_stopping_early_keeps_the_best_tree(lm):
    """Oracle: a lattice drafted to full depth (no floor, no budget) and one that stopped once `budget`
    nodes survive better than anything deeper give the same best tree of that budget."""
    full, pruned = random_head(lm, seed=5, floor=0.0), random_head(lm, seed=5, floor=0.0)
    shorter = 0
    for seed in range(40):
        hidden, root = _anchor(lm, seed)
        budget = 2 + seed % 7
        whole = full.lattice(hidden, root, LatticeRequest(10, 3))
        cut = pruned.lattice(hidden, root, LatticeRequest(10, 3, budget=budget))
        shorter += cut.lattice.gamma < whole.lattice.gamma
        assert _plan(best_tree(cut.lattice, budget)) == _plan(best_tree(whole.lattice, budget)), seed
    assert shorter >= 10, shorter          # the stop does happen


def test_a_looser_stop_changes_the_tree(lm, monkeypatch):
    """Negative control: stopping once half the budget survives better loses nodes the best tree needs."""
    loose = random_head(lm, seed=5, floor=0.0)
    full = random_head(lm, seed=5, floor=0.0)
    right = feature_lattice._Walk.settled

    def half(self, floor, budget):
        return right(self, floor, None if budget is None else max(1, budget // 2))

    differs = 0
    for seed in range(40):
        hidden, root = _anchor(lm, seed)
        budget = 4 + seed % 5
        whole = full.lattice(hidden, root, LatticeRequest(10, 3))
        with monkeypatch.context() as m:
            m.setattr(feature_lattice._Walk, "settled", half)
            cut = loose.lattice(hidden, root, LatticeRequest(10, 3, budget=budget))
        differs += _plan(best_tree(cut.lattice, budget)) != _plan(best_tree(whole.lattice, budget))
    assert differs >= 1


def test_unexpanded_parents_score_zero_and_expanded_ones_vary(lm):
    head = random_head(lm, seed=1, expand=1, floor=0.0)
    draft = head.lattice(*_anchor(lm, 3), LatticeRequest(4, 3))
    for k in range(1, draft.lattice.gamma):
        rows = draft.lattice.scores[k]
        assert sum(any(s > 0 for s in row) for row in rows) == 1          # one parent stepped
        assert sum(c > 0 for c in draft.confidence[k]) == 1
    wide = random_head(lm, seed=1, expand=3, floor=0.0).lattice(*_anchor(lm, 3), LatticeRequest(4, 3))
    assert any(len({tuple(r) for r in wide.lattice.scores[k]}) > 1 for k in range(1, 4))


def test_lookup_tokens_join_the_lattice(lm):
    """Prompt lookup's chain is a candidate at each of its positions, also a token outside the net's
    vocabulary slice (q = 0 there); once the head has stopped (here after position 1) the chain goes on
    alone, one candidate per position."""
    head = random_head(lm, seed=2, vocab=range(32), floor=1.0)
    extra = (40, 41, 5)
    draft = head.lattice(*_anchor(lm, 4), LatticeRequest(5, 2, extra=extra))
    assert draft.lattice.gamma == len(extra)
    assert [len(t) for t in draft.lattice.token_ids] == [3, 1, 1]
    for k, token in enumerate(extra):
        j = draft.extra[k]
        assert draft.lattice.token_ids[k][j] == token
        if token >= 32:
            assert draft.lattice.q_draft[k][j] == 0.0


def test_lattice_request_is_checked(lm, head):
    with pytest.raises(ConfigError, match="gamma"):
        head.lattice(*_anchor(lm, 0), LatticeRequest(17, 2))
    with pytest.raises(ConfigError, match="extra"):
        head.lattice(*_anchor(lm, 0), LatticeRequest(2, 2, extra=(1, 2, 3)))


# ------------------------------------------------------------------ calibration
def test_calibration_identity_platt_and_file(tmp_path):
    q = torch.tensor([0.1, 0.5, 0.9])
    assert torch.equal(HeadCalibration()(0, q), q)
    cal = HeadCalibration((2.0, 1.0), (0.5, -1.0))
    expect = torch.sigmoid(2.0 * torch.log(q / (1 - q)) + 0.5)
    assert torch.allclose(cal(0, q), expect)
    assert torch.allclose(cal(7, q), torch.sigmoid(torch.log(q / (1 - q)) - 1.0))    # past the last: the last
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": [1.5], "b": [0.2]}))
    assert HeadCalibration.load(good) == HeadCalibration((1.5,), (0.2,))
    for text in ("{", json.dumps({"format": "other", "a": [1], "b": [0]}),
                 json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": [1, 2], "b": [0]}),
                 json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": 5, "b": [0]}),
                 json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": ["x"], "b": [0]}),
                 json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "b": [0]})):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ConfigError, match="calibration"):
            HeadCalibration.load(bad)


def test_platt_fit_recovers_the_generating_pair():
    gen = random.Random(0)
    q = torch.tensor([gen.uniform(0.02, 0.98) for _ in range(20000)])
    p = torch.sigmoid(0.6 * torch.log(q / (1 - q)) - 0.4)
    hit = torch.tensor([gen.random() < float(v) for v in p])
    a, b = fit_platt(q, hit)
    assert abs(a - 0.6) < 0.05 and abs(b + 0.4) < 0.05, (a, b)


def test_ece_worked_example():
    """Two bins: scores 0.15 (3 samples, 1 hit) and 0.95 (1 sample, hit):
    ECE = 3/4 · |0.15 − 1/3| + 1/4 · |0.95 − 1| = 0.1375 + 0.0125."""
    score = torch.tensor([0.15, 0.15, 0.15, 0.95], dtype=torch.float64)
    hit = torch.tensor([True, False, False, True])
    assert math.isclose(ece(score, hit), 0.15, rel_tol=1e-9)
    assert ece(hit.double(), hit) == 0.0


def test_head_samples_follow_the_true_answer(lm):
    """Calibration samples: from each anchor the head steps along the target's own answer; a candidate
    is a hit when it equals the answer's token there (recomputed by hand for every anchor)."""
    from decoding.train.data import generate_distill
    from decoding.train.head_calibration import head_samples

    net = random_head(lm, seed=4).net
    data = generate_distill(lm, [[1, 2, 3], [7, 8]], answer_tokens=6, use_cache=False, progress=False)
    samples = head_samples(net, data, gamma=3, top_k=2)
    expected_q, expected_hit = [], []
    for s in range(len(data.offsets) - 1):
        start, end = int(data.offsets[s]), int(data.offsets[s + 1])
        for r in range(start, end - 1):
            feature, token = data.hidden[r].float(), data.tokens[r]
            for k in range(1, min(3, end - 1 - r) + 1):
                feature = net.step(feature, token)
                q_top, cols = torch.topk(torch.softmax(net.slice_logits(feature).float(), -1), 2)
                token = data.tokens[r + k]
                expected_q += q_top.tolist()
                expected_hit += (net.vocab_ids[cols] == token).tolist()
    assert sorted(samples.q.tolist()) == pytest.approx(sorted(expected_q), abs=1e-5)
    assert int(samples.hit.sum()) == sum(expected_hit) and len(samples.hit) == len(expected_hit)


def test_card_section_is_appended_then_replaced():
    from decoding.train.head_calibration import card_section, with_card_section

    def report(a):
        row = {"position": 1, "a": a, "b": -0.1, "hit_rate": 0.2, "ece_raw": 0.03, "ece_calibrated": 0.01}
        return {"data": {"prompts": 4, "answer_tokens": 8, "split": "held out", "positions": 30, "top_k": 4},
                "positions": [row]}

    card = "# Card\n\ntext\n"
    once = with_card_section(card, card_section(report(0.9)))
    assert once.startswith(card.rstrip()) and "| 1 | 0.900 | -0.100 | 0.200 | 0.030 | 0.010 |" in once
    twice = with_card_section(once, card_section(report(0.5)))
    assert twice.count("head-calibration -->") == 2 and "| 1 | 0.500 |" in twice and "0.900" not in twice


def test_only_the_drafters_own_calibration_file_updates_its_card(tmp_path):
    """Regression: with --out elsewhere the card was derived from the output's name, so a file not
    named *.calibration.json got the card section appended to the JSON itself."""
    from decoding.train.head_calibration import card_to_update

    weights = tmp_path / "net.safetensors"
    assert card_to_update(weights, tmp_path / "net.calibration.json") is None       # no card yet
    (tmp_path / "net.md").write_text("# card\n")
    assert card_to_update(weights, tmp_path / "net.calibration.json") == tmp_path / "net.md"
    assert card_to_update(weights, tmp_path / "other.json") is None


# ------------------------------------------------------------------------------ the pairs for T > 0
def test_sampled_pairs_score_the_head_above_temperature_zero(tmp_path):
    """A calibration file's `sampled` pairs are the ones used at T > 0; without them T > 0 keeps q."""
    q = torch.tensor([0.2, 0.5, 0.9])
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": [1.5], "b": [0.2],
                                "sampled": {"temperature": 0.8, "a": [0.5], "b": [-1.0]}}))
    cal = HeadCalibration.load(path)
    assert torch.allclose(cal.at(0)(0, q), torch.sigmoid(1.5 * torch.log(q / (1 - q)) + 0.2))
    assert torch.allclose(cal.at(0.8)(3, q), torch.sigmoid(0.5 * torch.log(q / (1 - q)) - 1.0))
    assert torch.allclose(cal.at(1.3)(0, q), cal.at(0.8)(0, q))
    assert torch.equal(HeadCalibration((1.5,), (0.2,)).at(0.8)(0, q), q)                 # none fitted: q itself
    for sampled in ({"a": [1]}, {"a": [float("nan")], "b": [0]}, [1, 2], {"a": [1, 2], "b": [0]}):
        path.write_text(json.dumps({"format": feature_lattice.CALIBRATION_FORMAT, "a": [1], "b": [0],
                                    "sampled": sampled}))
        with pytest.raises(ConfigError, match="calibration"):
            HeadCalibration.load(path)


def test_the_lattice_at_temperature_uses_the_sampled_pairs(lm):
    """The same head at T = 0.8: with sampled pairs its scores are σ(a · logit q_T + b), without them q_T."""
    plain = random_head(lm, seed=5)
    fitted = random_head(lm, seed=5, calibration=HeadCalibration((1.0,), (0.0,), HeadCalibration((0.5,), (-1.0,))))
    hidden = torch.randn(1, lm.model.config.hidden_size)
    request = LatticeRequest(2, 3, 0.8)
    raw = plain.lattice(hidden, [4], request).lattice.scores[0][0]
    calibrated = fitted.lattice(hidden, [4], request).lattice.scores[0][0]
    expect = [float(torch.sigmoid(0.5 * torch.logit(torch.tensor(v)) - 1.0)) for v in raw]
    assert calibrated == pytest.approx(expect, abs=1e-5) and calibrated != pytest.approx(raw, abs=1e-3)


def test_target_probabilities_at_temperature_are_the_models(lm):
    """target_probs_at over the stored LM-head inputs equals the target's own softmax(logits / T) at the
    answer's positions (a forward over prompt + answer); at another temperature they differ."""
    from decoding.train.data import generate_distill
    from decoding.train.head_calibration import Target, target_probs_at

    prompt = [1, 2, 3]
    data = generate_distill(lm, [prompt], answer_tokens=5, use_cache=False, progress=False)
    answer = data.tokens.tolist()
    with torch.inference_mode():
        logits = lm.model(torch.tensor([prompt + answer])).logits[0].float()       # (T, V)
    tokens = torch.tensor([[5, 9], [answer[1], 2], [7, 7], [answer[3], 1], [0, 3]])
    head = lm.model.get_output_embeddings().weight
    got = target_probs_at(Target(head, 0.8), data.hidden, tokens, rows=2)
    want = torch.softmax(logits[len(prompt) - 1:len(prompt) + 4] / 0.8, -1).gather(1, tokens)
    assert torch.allclose(got, want, atol=2e-3)
    assert not torch.allclose(target_probs_at(Target(head, 0.3), data.hidden, tokens), want, atol=2e-3)


def test_calibrate_fits_both_sets_of_pairs(lm):
    """With a target the samples carry q and p at T, and the report holds the pairs for T > 0 under
    `sampled`; the soft fit recovers a generating pair."""
    from decoding.train.data import generate_distill
    from decoding.train.head_calibration import Target, calibrate, head_samples

    net = random_head(lm, seed=4).net
    data = generate_distill(lm, [[1, 2, 3], [7, 8], [5, 6, 9]], answer_tokens=8, use_cache=False, progress=False)
    samples = head_samples(net, data, gamma=2, top_k=3, target=Target(lm.model.get_output_embeddings().weight, 0.8))
    assert len(samples.q_sampled) == len(samples.p_target) == len(samples.q)
    assert bool(((samples.p_target >= 0) & (samples.p_target <= 1)).all()) and bool((samples.q_sampled > 0).all())
    report = calibrate(samples, 2, temperature=0.8)
    assert report["sampled"]["temperature"] == 0.8 and len(report["sampled"]["a"]) == 2
    gen = random.Random(1)
    q = torch.tensor([gen.uniform(0.02, 0.98) for _ in range(5000)])
    p = torch.sigmoid(0.6 * torch.log(q / (1 - q)) - 0.4)
    a, b = fit_platt(q, p)                                               # soft labels: the chances themselves
    assert abs(a - 0.6) < 0.02 and abs(b + 0.4) < 0.02, (a, b)
