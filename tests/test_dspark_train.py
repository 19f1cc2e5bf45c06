"""Training the parallel drafter on a tiny llama: the distillation data equals plain greedy answers and
the target's own hidden states (negative control: rows shifted by one position do not match), it is
cached, training fits its data, calibration is fitted, the weights and model card are written, and a
trained drafter stays token-identical to greedy at temperature 0 in chain and tree mode."""
from __future__ import annotations

import pytest
import torch
from dspark_helpers import (  # noqa: F401  (prompts: a fixture)
    SETTINGS,
    module_cache,
    one_thread,
    prompts,
    varied_llama,
)

from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.drafters.parallel import load_drafter
from decoding.runner import run
from decoding.runtime.hooks import tap_head_input
from decoding.train.data import anchors, estimate_bytes, generate_distill
from decoding.train.parallel import TrainSettings, conditioned, evaluate, report_metrics, train_parallel

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=1, init=0.1, eos_token_id=None)


cache_dir = pytest.fixture(scope="module", autouse=True)(module_cache)


def test_distill_data_equals_greedy_and_hidden_states(lm, prompts, cache_dir):
    data = generate_distill(lm, prompts, answer_tokens=12, batch_size=5, progress=False)
    assert data.positions == 16 * 12 and data.hidden.dtype == torch.float16 and data.soft_ids.shape[1] == 8
    for s in (0, 3, 15):      # in different left-padded batches
        rows = slice(int(data.offsets[s]), int(data.offsets[s + 1]))
        answer = data.tokens[rows].tolist()
        assert tuple(answer) == run(lm, prompts[s], GreedyConfig(max_new_tokens=12)).output_ids
        with tap_head_input(lm) as tap:
            lm.forward(prompts[s] + answer, lm.new_cache())
        ref = tap.hidden[0, len(prompts[s]) - 1:-1]                           # (12, H)
        stored = data.hidden[rows].float()
        assert (stored - ref).abs().max() < 1e-2 * ref.abs().max()
        shifted = (data.hidden[rows][1:].float() - ref[:-1]).abs().max()      # negative control
        assert shifted > 0.1 * ref.abs().max()
        assert data.soft_ids[rows][:, 0].tolist() == answer                  # greedy = the top-1 label
    again = generate_distill(lm, prompts, answer_tokens=12, batch_size=5, progress=False)
    assert torch.equal(again.hidden, data.hidden) and len(list(cache_dir.glob("distill/*.pt"))) == 1
    bound = estimate_bytes(16, 12, lm.model.config.hidden_size, 8)
    assert data.hidden.numel() * 2 <= bound


@pytest.fixture(scope="module")
def trained(lm, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("assets") / "tiny.safetensors"
    report = train_parallel(lm, SETTINGS, out, prompts=prompts, progress=False)
    return out, report


@pytest.mark.slow
def test_training_fits_and_writes_weights_and_card(lm, prompts, trained):
    out, report = trained
    drafter = load_drafter(out, lm)
    untrained = load_drafter(out, lm)
    with torch.no_grad():
        for p in (untrained.w2, untrained.seq_in, untrained.conf_w):
            p.zero_()
    data = generate_distill(lm, prompts, answer_tokens=SETTINGS.answer_tokens, batch_size=SETTINGS.gen_batch,
                            progress=False)
    slice_of = torch.full((lm.vocab_size,), -1, dtype=torch.long)
    slice_of[drafter.vocab_ids] = torch.arange(len(drafter.vocab_ids))
    hits = evaluate(drafter, data, 6, slice_of)["hits"].float().mean()
    base = evaluate(untrained, data, 6, slice_of)["hits"].float().mean()
    assert hits > base + 0.1              # training fits its data
    assert report.steps == 120 and report.size_bytes == out.stat().st_size < 20e6
    assert not torch.equal(drafter.platt_a, torch.ones(6)) or not torch.equal(drafter.platt_b, torch.zeros(6))
    card = out.with_suffix(".md").read_text()
    assert "| position | top-1 |" in card and "Held-out results" in card and "120 steps" in card
    assert "weight decay 0.01, dropout 0.0" in card
    assert drafter.meta["metrics"]["tau_chain"]["1"] >= 1.0
    assert len(anchors(data)) == data.positions - 16


@pytest.mark.parametrize("select,gamma,k,budget", [("chain", 6, 1, 1), ("chain", 6, 3, 1), ("tree", 6, 3, 10)])
@pytest.mark.slow
def test_trained_drafter_equals_greedy(lm, prompts, trained, select, gamma, k, budget):
    out, _ = trained
    drafter = load_drafter(out, lm)
    accepted = 0
    for prompt in prompts[:4]:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, gamma=gamma, top_k_candidates=k, select=select,
                                          budget=budget), drafter=drafter)
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
        accepted += sum(len(e.accepted_path) for e in tr.steps)
    assert accepted > 0


@pytest.mark.slow
def test_backbone_drafter_trains_in_chunks_and_stays_exact(lm, prompts, tmp_path):
    """A drafter with a backbone over its history (trained in runs of consecutive anchors) fits its
    data, says so on its card, and decodes token-identical to greedy."""
    import dataclasses

    settings = dataclasses.replace(SETTINGS, layers=1, window=4, chunk=8, trunk=32, steps=80)
    out = tmp_path / "ctx.safetensors"
    report = train_parallel(lm, settings, out, prompts=prompts, progress=False)
    drafter = load_drafter(out, lm)
    assert drafter.shape.layers == 1 and drafter.span == 4
    data = generate_distill(lm, prompts, answer_tokens=SETTINGS.answer_tokens, batch_size=SETTINGS.gen_batch,
                            progress=False)
    slice_of = torch.full((lm.vocab_size,), -1, dtype=torch.long)
    slice_of[drafter.vocab_ids] = torch.arange(len(drafter.vocab_ids))
    untrained = load_drafter(out, lm)
    with torch.no_grad():
        for p in (untrained.w2, untrained.seq_in, untrained.conf_w):
            p.zero_()
    assert (evaluate(drafter, data, 6, slice_of)["hits"].float().mean()
            > evaluate(untrained, data, 6, slice_of)["hits"].float().mean() + 0.1)
    card = out.with_suffix(".md").read_text()
    assert "last 4 emitted positions, through 1 attention block(s) of window 4" in card
    assert "up to 64 anchors (runs of 8 consecutive)" in card
    assert report.shape["window"] == 4
    for prompt in prompts[:3]:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, gamma=6, top_k_candidates=2), drafter=drafter)
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids


def test_train_command_line_errors(capsys):
    from decoding.__main__ import main

    assert main(["train"]) == 2
    assert main(["train", "parallel", "--steps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: steps=0 is invalid: must be an integer >= 1"


def test_heldout_prompts_share_no_base_prompt_with_training():
    from decoding.train.data import _STYLES, distill_prompts, split_sequences

    prompts = distill_prompts(2500)
    assert len(set(prompts)) == 2500

    def base(text):
        for style in _STYLES[1:]:
            text = text.removesuffix(style)
        return text

    train, held = split_sequences(len(prompts), 16)
    assert held and not ({base(prompts[i]) for i in held} & {base(prompts[i]) for i in train})
    naive = [i for i in range(len(prompts)) if i % 16 == 15]            # negative control
    rest = [i for i in range(len(prompts)) if i % 16 != 15]
    assert {base(prompts[i]) for i in naive} & {base(prompts[i]) for i in rest}


def test_batch_alignment():
    """Row i feeds (hidden[i], tokens[i]); position k's label is tokens[i + k] in the same sequence,
    its parent tokens[i + k − 1]; past the sequence end the label is −2, outside the slice −1."""
    from decoding.train.data import DistillData, make_batch

    tokens = torch.tensor([10, 11, 12, 13, 20, 21, 22])
    data = DistillData(tokens, torch.arange(7.0)[:, None].repeat(1, 4).half(), tokens[:, None].int().repeat(1, 2),
                       torch.ones(7, 2).half(), torch.tensor([0, 4, 7]))
    slice_of = torch.full((64,), -1, dtype=torch.long)
    keep = torch.tensor([10, 11, 12, 20, 21, 22])                         # 13 is outside the slice
    slice_of[keep] = torch.arange(6)
    batch = make_batch(data, torch.tensor([1, 4]), 3, slice_of)
    assert batch.root.tolist() == [11, 20] and batch.hidden[:, 0].tolist() == [1.0, 4.0]
    assert batch.labels.tolist() == [[2, -1, -2], [4, 5, -2]]
    assert batch.parents[:, :2].tolist() == [[11, 12], [20, 21]]
    assert batch.soft_ids[0, 0].tolist() == [2, 2] and batch.soft_ids[0, 2].tolist() == [-1, -1]
    assert batch.future is None
    ahead = make_batch(data, torch.tensor([1, 4]), 3, slice_of, future_width=2).future   # (B, γ, 2)
    assert ahead[..., 0].tolist() == [[2.0, 3.0, 1.0], [5.0, 6.0, 4.0]]  # row i + k; past the end the anchor's
    assert ahead.shape == (2, 3, 2)


def test_feature_loss_reads_the_rows_ahead_and_masks_past_the_end():
    """Zero when each position's z is the LM-head input that produced its label; a z one position off
    (the negative control) is not; positions past the sequence end do not count."""
    from decoding.train.data import DistillData, make_batch
    from decoding.train.parallel import feature_loss

    gen = torch.Generator().manual_seed(0)
    tokens = torch.arange(9) % 5
    data = DistillData(tokens, torch.randn(9, 6, generator=gen).half(), tokens[:, None].int(), torch.ones(9, 1).half(),
                       torch.tensor([0, 5, 9]))
    slice_of = torch.arange(64)
    rows = torch.tensor([0, 2, 5])
    batch = make_batch(data, rows, 4, slice_of, future_width=4)
    inside = batch.labels != -2
    truth = torch.stack([data.hidden[torch.clamp(rows + k, max=8)][:, :4].float() for k in range(1, 5)], 1)
    assert torch.equal(batch.future[inside], truth[inside])
    assert float(feature_loss(batch.future, batch.future, batch.labels)) == 0.0
    garbage = torch.where(inside[..., None], batch.future, 1e3)              # past the end: ignored
    assert float(feature_loss(garbage, batch.future, batch.labels)) == 0.0
    shifted = batch.future.roll(1, dims=1)                                    # negative control
    assert float(feature_loss(shifted, batch.future, batch.labels)) > 0.1


@pytest.mark.slow
def test_feature_weight_trains_the_hidden_states_toward_the_target(lm, prompts, tmp_path):
    """With feature_weight the drafted hidden states end closer to the target's LM-head inputs than
    without; the card names the term; the drafter stays token-identical to greedy."""
    from dataclasses import replace

    from decoding.train.data import anchors, data_split, make_batch
    from decoding.train.parallel import draft_at, feature_loss, slice_index

    data = generate_distill(lm, prompts, answer_tokens=SETTINGS.answer_tokens, batch_size=SETTINGS.gen_batch,
                            progress=False)
    distance = {}
    for weight in (0.0, 1.0):
        out = tmp_path / f"w{weight}.safetensors"
        train_parallel(lm, replace(SETTINGS, feature_weight=weight), out, prompts=prompts, progress=False)
        drafter = load_drafter(out, lm)
        train = data.subset(data_split(data, SETTINGS.heldout_every)[0])
        rows = anchors(train)
        batch = make_batch(train, rows, SETTINGS.gamma_max, slice_index(drafter), lm.model.config.hidden_size)
        with torch.no_grad():
            distance[weight] = float(feature_loss(draft_at(drafter, train, rows).z, batch.future, batch.labels))
        card = out.with_suffix(".md").read_text()
        assert ("smooth-L1 of each position's hidden state" in card) == (weight > 0)
    assert distance[1.0] < 0.8 * distance[0.0]
    tr = run(lm, prompts[0], DSparkConfig(max_new_tokens=20, gamma=6, top_k_candidates=2), drafter=drafter)
    assert tr.output_ids == run(lm, prompts[0], GreedyConfig(max_new_tokens=20)).output_ids


def test_dropout_acts_in_training_only_and_is_checked():
    from dspark_helpers import random_drafter

    from decoding.core.errors import ConfigError

    lm = varied_llama(seed=3)
    drafter = random_drafter(lm, gamma_max=4, seed=1)
    hidden, root = torch.randn(5, lm.model.config.hidden_size), torch.tensor([1, 2, 3, 4, 5])
    drafter.dropout = 0.5
    drafter.train()
    torch.manual_seed(0)
    a, b = drafter(hidden, root).z, drafter(hidden, root).z
    assert not torch.equal(a, b)                                  # dropout draws differ while training
    drafter.eval()
    assert torch.equal(drafter(hidden, root).z, drafter(hidden, root).z)
    drafter.dropout = 0.0
    trained_mode = drafter.train()(hidden, root).z
    assert torch.equal(trained_mode, drafter.eval()(hidden, root).z)       # dropout is the only difference
    for field, bad in (("dropout", 1.0), ("dropout", -0.1), ("weight_decay", -1.0), ("feature_weight", -0.5),
                       ("feature_weight", float("inf"))):
        with pytest.raises(ConfigError) as err:
            TrainSettings(**{field: bad})
        assert err.value.param == field


def old_ece(probs: torch.Tensor, hits: torch.Tensor, bins: int = 10) -> float:
    """train/parallel.py's own calibration error before it used the shared one (decoding.train.common.ece)."""
    idx = (probs * bins).long().clamp(max=bins - 1)
    err = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            err += float(sel.float().mean()) * abs(float(probs[sel].mean()) - float(hits[sel].float().mean()))
    return err


def test_report_metrics_use_the_shared_tau_and_calibration_error():
    """The parallel trainer's held-out τ per γ and ECE are the shared definitions (lead_metrics, ece), equal to
    the loops they replaced up to float32 rounding. Negative control: τ from mean hits (no survival) differs."""
    gen = torch.Generator().manual_seed(0)
    hits = torch.rand(200, 4, generator=gen) < 0.6
    valid = torch.ones(200, 4, dtype=torch.bool)
    valid[-30:, 2:] = False
    ev = {"hits": hits, "valid": valid, "conf": torch.randn(200, 4, generator=gen)}

    class Drafter:
        def calibrated(self, k, logits):
            return torch.sigmoid(0.5 * logits + 0.1)

    got = report_metrics(Drafter(), ev)
    lead = torch.cumprod(hits[valid.all(1)].int(), 1)
    old_tau = {g: 1 + float(lead[:, :g].sum(1).float().mean()) for g in range(1, 5)}
    assert got["tau_chain"] == pytest.approx(old_tau, abs=1e-6) and len(got["tau_chain"]) == 4
    for k, row in enumerate(got["per_position"]):
        sel = conditioned(ev)[:, k]
        assert row["ece_raw"] == pytest.approx(old_ece(torch.sigmoid(ev["conf"][sel, k]), hits[sel, k]), abs=1e-6)
        assert row["ece_calibrated"] == pytest.approx(
            old_ece(Drafter().calibrated(k, ev["conf"][sel, k]), hits[sel, k]), abs=1e-6)
    mean_hits = {g: 1 + float(hits[valid.all(1)][:, :g].float().sum(1).mean()) for g in range(1, 5)}
    assert got["tau_chain"][4] != pytest.approx(mean_hits[4], abs=1e-3)
