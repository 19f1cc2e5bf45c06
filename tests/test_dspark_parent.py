"""The parent-conditioned per-position block (`parent_mlp`): the token at k−1 enters position k's block,
not only a low-rank bias of its logits. The lattice scores every node the way training computes it
(negative control: the root as every position's parent scores differently), the parent moves z only in
such a drafter, it can fit what an additive previous-token bias provably cannot (an XOR of the anchor's
state and the parent: the plain drafter stays at or below 3/4 there), and a trained one decodes
token-identical to greedy."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from dspark_helpers import (  # noqa: F401  (prompts: a fixture)
    SETTINGS,
    module_cache,
    one_thread,
    prompts,
    random_drafter,
    varied_llama,
)

from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.drafters.parallel import build_lattice, load_drafter
from decoding.runner import run
from decoding.train.data import DistillData
from decoding.train.parallel import TrainSettings, build_parser, evaluate, slice_index, train_drafter, train_parallel

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
cache_dir = pytest.fixture(scope="module", autouse=True)(module_cache)


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=1, init=0.1, eos_token_id=None)


def teacher_node(drafter, hidden, history, pos, parents):
    """Training's form of position `pos` under each parent (P,): (logits (P, V_s), z (P, H))."""
    p = len(parents)
    chain = torch.full((p, drafter.shape.gamma_max), history[-1])
    chain[:, pos] = torch.tensor(parents)
    out = drafter(hidden[None].expand(p, -1, -1), torch.tensor([history] * p), parents=chain)
    return out.base[:, pos] + drafter.parent_bias(pos, torch.tensor(parents)), out.z[:, pos]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lattice_nodes_are_trainings_form(lm, temperature):
    drafter = random_drafter(lm, gamma_max=6, parent_mlp=True)
    with torch.no_grad():
        drafter.platt_a.uniform_(0.5, 2.0)
        drafter.platt_b.uniform_(-1.0, 1.0)
    hidden, history = torch.randn(1, lm.model.config.hidden_size), [9]
    draft = build_lattice(drafter, hidden, history, 5, 3, temperature)
    moved = 0.0
    with torch.no_grad():
        parents = history
        for pos, row in enumerate(draft.confidence):
            logits, z = teacher_node(drafter, hidden, history, pos, parents)
            want = drafter.calibrated(pos, drafter.confidence_logit(pos, z, logits))
            torch.testing.assert_close(torch.tensor(row), want.float(), rtol=1e-5, atol=1e-6)
            q = torch.softmax(logits / temperature, -1) if temperature else torch.softmax(logits, -1)
            ids = [int((drafter.vocab_ids == t).nonzero()) for t in draft.lattice.token_ids[pos]]
            scores = torch.tensor(draft.lattice.scores[pos])
            if temperature:
                torch.testing.assert_close(scores, q[:, ids].clamp(0, 1), rtol=1e-5, atol=1e-6)
            root_logits, _ = teacher_node(drafter, hidden, history, pos, history * len(parents))   # the control
            moved = max(moved, float((root_logits - logits).abs().max()))
            parents = draft.lattice.token_ids[pos]
    assert moved > 0.1


def test_parent_moves_z_only_with_parent_mlp(lm):
    hidden, root = torch.randn(2, lm.model.config.hidden_size), torch.tensor([3, 3])
    one, other = torch.tensor([[3, 5, 7, 9]] * 2), torch.tensor([[3, 6, 7, 9]] * 2)
    with torch.no_grad():
        plain = random_drafter(lm, gamma_max=4)
        assert torch.equal(plain(hidden, root, parents=one).z, plain(hidden, root, parents=other).z)
        cond = random_drafter(lm, gamma_max=4, parent_mlp=True)
        a, b = cond(hidden, root, parents=one).z, cond(hidden, root, parents=other).z
    assert torch.equal(a[:, [0, 2, 3]], b[:, [0, 2, 3]]) and not torch.allclose(a[:, 1], b[:, 1])
    with pytest.raises(ConfigError) as err:
        cond(hidden, root)
    assert "parents" in str(err.value) and "\n" not in str(err.value)


def xor_data(lm, n: int = 96, seed: int = 0) -> tuple[DistillData, list[int]]:
    """Sequences [r, a, b]: r fixed, the anchor's hidden row carries a bit s, a one of two tokens, and
    b = B[s XOR (a == A1)]. Logits base(s) + bias(a) cannot order B1 over B0 in exactly the XOR cases
    (the four sign conditions sum to a contradiction), so a plain drafter gets at most 3/4 of b."""
    gen = torch.Generator().manual_seed(seed)
    r, (a0, a1), (b0, b1) = 1, (10, 20), (30, 40)
    hid = lm.model.config.hidden_size
    direction = torch.randn(hid, generator=gen)
    s, a = torch.arange(n) % 2, torch.arange(n) // 2 % 2          # the four (s, a) cells equally often
    b = s ^ a
    tokens = torch.stack([torch.full((n,), r), torch.where(a == 1, a1, a0), torch.where(b == 1, b1, b0)], 1)
    rows = torch.randn(n, 3, hid, generator=gen) * 0.1
    rows[:, 0] += (2.0 * s[:, None] - 1) * direction
    flat = tokens.flatten()
    data = DistillData(flat, rows.flatten(0, 1).half(), flat[:, None].int(), torch.ones(3 * n, 1).half(),
                       torch.arange(0, 3 * n + 1, 3), {"parts": [n]})
    return data, [r, a0, a1, b0, b1]


def xor_hits(lm, parent_mlp: bool) -> float:
    data, vocab = xor_data(lm)
    settings = TrainSettings(gamma_max=2, rank=8, trunk=32, width=32, steps=300, batch_size=64, lr=1e-2,
                             heldout_every=1000, parent_mlp=parent_mlp)
    drafter, _ = train_drafter(lm, data, settings, progress=False)
    ev = evaluate(drafter, data, 2, slice_index(drafter))
    assert sorted(drafter.vocab_ids.tolist()) == sorted(vocab)
    return float(ev["hits"][ev["valid"][:, 1], 1].float().mean())     # position 2 from each sequence's start


@pytest.mark.slow
def test_parent_mlp_fits_what_an_additive_bias_cannot(lm):
    assert xor_hits(lm, parent_mlp=True) > 0.95
    assert xor_hits(lm, parent_mlp=False) <= 0.75      # the negative control: 3/4 at most, by construction


@pytest.mark.slow
def test_parent_mlp_trains_saves_and_stays_exact(lm, prompts, tmp_path):  # noqa: F811 - the fixture
    settings = dataclasses.replace(SETTINGS, parent_mlp=True, steps=80)
    out = tmp_path / "parent.safetensors"
    report = train_parallel(lm, settings, out, prompts=prompts, progress=False)
    drafter = load_drafter(out, lm)
    assert drafter.shape.parent_mlp and report.shape["parent_mlp"] and drafter.parent_in.shape == (6, 32, 32)
    assert "the token at k−1 enters position k's block" in out.with_suffix(".md").read_text()
    accepted = 0
    for prompt, select, budget in ((prompts[0], "chain", 1), (prompts[1], "tree", 10), (prompts[2], "chain", 1)):
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, gamma=6, top_k_candidates=3, select=select,
                                          budget=budget), drafter=drafter)
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        accepted += sum(len(e.accepted_path) for e in tr.steps)
    assert accepted > 0


def test_parent_mlp_flag():
    parser = build_parser()
    assert parser.parse_args(["--parent-mlp"]).parent_mlp is True
    assert parser.parse_args([]).parent_mlp is False
    with pytest.raises(ConfigError) as err:
        TrainSettings(parent_mlp=1)
    assert "parent_mlp" in str(err.value) and "\n" not in str(err.value)
