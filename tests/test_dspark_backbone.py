"""The parallel drafter's backbone over the history window: chunked training encodes each anchor as
decoding does (every row's window, several blocks deep), the window is what the anchor depends on
(negative control: a row outside it changes nothing, one inside changes the output), untrained blocks
are the identity, the decoder hands the drafter the target's own LM-head inputs for the last emitted
tokens (checked against a fresh forward over the whole context), output stays token-identical to
greedy, the weights round-trip, and bad shapes are one-line errors."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from dspark_helpers import Recorder, one_thread, random_drafter, varied_llama

from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.drafters.parallel import DrafterShape, ParallelDrafter, build_lattice, load_drafter
from decoding.runner import run
from decoding.runtime.hooks import tap_head_input
from decoding.strategies import dspark
from decoding.train.data import DistillData, history_rows, training_chunks
from decoding.train.parallel import draft_at, encode_rows

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=2)


def toy_data(lm, lengths=(9, 3, 14), seed=0) -> DistillData:
    gen = torch.Generator().manual_seed(seed)
    n, h = sum(lengths), lm.model.config.hidden_size
    tokens = torch.randint(lm.vocab_size, (n,), generator=gen)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    return DistillData(tokens, torch.randn(n, h, generator=gen).half(), tokens[:, None].int(),
                       torch.ones(n, 1).half(), offsets)


def test_history_rows_stop_at_the_sequence_start(lm):
    data = toy_data(lm)
    rows, valid = history_rows(data, torch.tensor([0, 10, 20]), 4)
    assert rows.tolist() == [[0, 0, 0, 0], [10, 10, 9, 10], [17, 18, 19, 20]]
    assert valid.tolist() == [[False, False, False, True], [False, False, True, True], [True] * 4]


@pytest.mark.parametrize("layers,window", [(1, 4), (2, 3), (0, 1)])
def test_chunked_training_encodes_anchors_as_decoding_does(lm, layers, window):
    """training_chunks + one backbone pass per chunk == each anchor's own history window."""
    drafter = random_drafter(lm, gamma_max=4, layers=layers, window=window)
    data = toy_data(lm)
    pool = torch.arange(data.positions)
    rows, valid, is_anchor = training_chunks(data, pool, torch.Generator().manual_seed(1), 12, 5, drafter.span)
    assert is_anchor.any()
    with torch.no_grad():
        u = encode_rows(drafter, data, rows, valid)
        chunked = drafter.draft_positions(u[is_anchor], data.hidden[rows[is_anchor]].float()).base
        alone = draft_at(drafter, data, rows[is_anchor]).base
    torch.testing.assert_close(chunked, alone, rtol=1e-5, atol=1e-5)
    seq_end = data.offsets[torch.searchsorted(data.offsets, rows[is_anchor], right=True)]
    assert (rows[is_anchor] < seq_end - 1).all()            # every anchor has a next token to predict


def test_window_is_what_the_anchor_sees(lm):
    drafter = random_drafter(lm, gamma_max=4, layers=2, window=3)
    assert drafter.span == 5
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 8, lm.model.config.hidden_size, generator=gen)
    tokens = torch.randint(lm.vocab_size, (1, 8), generator=gen)
    with torch.no_grad():
        base = drafter(hidden, tokens).base
        far, near = hidden.clone(), hidden.clone()
        far[0, 2] += 5.0                    # 6 rows before the anchor: outside the span
        near[0, 3] += 5.0                   # 5th row counting the anchor: inside
        assert torch.equal(drafter(far, tokens).base, base)
        assert not torch.allclose(drafter(near, tokens).base, base)


def test_untrained_blocks_are_the_identity(lm):
    shape = {"hidden_size": lm.model.config.hidden_size, "vocab_size": lm.vocab_size, "gamma_max": 4, "rank": 8,
                 "trunk": 32, "width": 16, "heads": 4, "mlp": 32}
    plain = ParallelDrafter(DrafterShape(**shape), seed=3).attach(lm)
    deep = ParallelDrafter(DrafterShape(**shape, layers=2, window=4), seed=3).attach(lm)
    hidden, tokens = torch.randn(2, 6, shape["hidden_size"]), torch.randint(lm.vocab_size, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(deep(hidden, tokens).base, plain(hidden[:, -1], tokens[:, -1]).base)


@pytest.mark.parametrize("select,k,budget", [("chain", 1, 1), ("tree", 3, 10)])
def test_decoder_history_is_the_targets_own_hidden_states(lm, monkeypatch, select, k, budget):
    """Each round's history rows equal what the LM head reads at those positions in one fresh forward
    over prompt + output: the hidden state that produced each of the last emitted tokens."""
    drafter = random_drafter(lm, gamma_max=6, layers=1, window=4)
    prompt = [3, 14, 15, 9]
    greedy = list(run(lm, prompt, GreedyConfig(max_new_tokens=40)).output_ids)
    recorder = Recorder(dspark.DSparkDecoder.round, prompt, greedy).install(monkeypatch)
    tr = run(lm, prompt, DSparkConfig(max_new_tokens=40, gamma=5, top_k_candidates=k, select=select,
                                      budget=budget, cost_table="none"), drafter=drafter)   # no probe run
    out = list(tr.output_ids)
    assert out == greedy
    assert max(len(e.accepted_path) for e in tr.steps[1:]) >= 2     # multi-token rounds happened
    with tap_head_input(lm) as tap:
        lm.forward(prompt + out, lm.new_cache())
    full = tap.hidden[0]                                              # (T, H): row t produces token t + 1
    context = prompt + out
    for hidden, tokens, position in recorder.calls:
        n = len(tokens)
        assert 1 <= n <= drafter.span and hidden.shape[0] == n
        assert tokens == context[position - n:position]
        torch.testing.assert_close(hidden, full[position - n - 1:position - 1], rtol=1e-4, atol=1e-4)
    assert max(len(t) for _, t, _ in recorder.calls) == drafter.span       # the window filled up
    assert len(recorder.calls) < len(out) - 1                              # and rounds emitted several tokens


def test_history_check_bites(lm, monkeypatch):
    """Negative control: a decoder that keeps the root's hidden state for every emitted token (one
    row per round, not one per token) fails the comparison above."""
    drafter = random_drafter(lm, gamma_max=6, layers=1, window=4)
    prompt = [3, 14, 15, 9]
    greedy = list(run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids)
    real = dspark.DSparkDecoder.round

    def stale(decoder, step):
        result = real(decoder, step)
        return dataclasses.replace(result, produced=result.produced[:1].expand(len(result.produced), -1))

    recorder = Recorder(stale, prompt, greedy).install(monkeypatch)
    out = run(lm, prompt, DSparkConfig(max_new_tokens=30, gamma=5, cost_table="none"), drafter=drafter).output_ids
    out = list(out)
    with tap_head_input(lm) as tap:
        lm.forward(prompt + out, lm.new_cache())
    full = tap.hidden[0]
    assert any(not torch.allclose(hidden, full[position - len(t) - 1:position - 1], rtol=1e-4, atol=1e-4)
               for hidden, t, position in recorder.calls)


def test_backbone_round_trips_through_the_file(lm, tmp_path):
    drafter = random_drafter(lm, gamma_max=4, layers=1, window=5)
    path = tmp_path / "d.safetensors"
    drafter.save(path)
    again = load_drafter(path, lm)
    assert again.shape == drafter.shape and again.span == 5
    hidden, tokens = torch.randn(1, 5, lm.model.config.hidden_size), torch.randint(lm.vocab_size, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(again(hidden, tokens).base, drafter(hidden, tokens).base, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("field,bad", [("layers", -1), ("window", 0), ("heads", 5), ("mlp", 0)])
def test_bad_backbone_shape_is_one_line(field, bad):
    args = {"hidden_size": 16, "vocab_size": 32, "trunk": 32, "layers": 1, "window": 4, "heads": 4}
    with pytest.raises(ConfigError) as err:
        DrafterShape(**{**args, field: bad})
    assert field in str(err.value) and str(bad) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lattice_confidences_are_trainings_definition(lm, temperature):
    """build_lattice computes confidences in two parts (hidden-state part once per lattice); they equal
    calibrated(confidence_logit(...)), the form training fits and calibrates, for every parent."""
    drafter = random_drafter(lm, gamma_max=6, layers=1, window=3)
    with torch.no_grad():
        drafter.platt_a.uniform_(0.5, 2.0)
        drafter.platt_b.uniform_(-1.0, 1.0)
    hidden, history = torch.randn(3, lm.model.config.hidden_size), [5, 9, 11]
    draft = build_lattice(drafter, hidden, history, 5, 3, temperature)
    with torch.no_grad():
        out = drafter(hidden[None], torch.tensor([history]))
        parents = [history[-1]]
        for pos, row in enumerate(draft.confidence):
            logits = out.base[0, pos] + drafter.parent_bias(pos, torch.tensor(parents))
            want = drafter.calibrated(pos, drafter.confidence_logit(pos, out.z[0, pos].expand(len(parents), -1),
                                                                    logits))
            torch.testing.assert_close(torch.tensor(row), want.float(), rtol=1e-5, atol=1e-6)
            parents = draft.lattice.token_ids[pos]
