"""A parallel drafter that also reads intermediate decoder layers of the target ("feature layers"):
the decoder hands it, for every history token, the LM-head input and the chosen layers' outputs at the
position that produced the token, and these equal what training reads from a teacher-forced batch
over left-padded prompts (negative control: a decoder tapping another layer fails); the features
change the drafts; output stays token-identical to greedy; a drafter trained with them fits its data
and says so on its card; weights round-trip; bad layer indices are one-line errors."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from dspark_helpers import Recorder, one_thread, random_drafter, varied_llama

from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.errors import ConfigError
from decoding.drafters.parallel import DrafterShape, load_drafter
from decoding.runner import run
from decoding.runtime.hooks import tap_head_input
from decoding.strategies import dspark
from decoding.train.data import drafter_data, generate_distill, layer_features
from decoding.train.parallel import TrainSettings, evaluate, slice_index, train_parallel

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=2)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))


def training_rows(lm, prompts, answers, layers):
    """What training reads for each sequence: rows (n, H·(1 + E)) from generate_distill's teacher pass
    and layer_features, both batched over left-padded prompts."""
    data = generate_distill(lm, prompts, answer_tokens=max(len(a) for a in answers), batch_size=len(prompts),
                            use_cache=False, progress=False)
    assert [data.answer(s) for s in range(len(prompts))] == answers        # the same answers as decoding
    data = drafter_data(lm, prompts, data, layers, batch_size=len(prompts), use_cache=False, progress=False)
    return [data.hidden[int(data.offsets[s]):int(data.offsets[s + 1])].float() for s in range(len(prompts))]


def decode_recorded(lm, drafter, prompt, monkeypatch, n=30):
    greedy = list(run(lm, prompt, GreedyConfig(max_new_tokens=n)).output_ids)
    recorder = Recorder(dspark.DSparkDecoder.round, prompt, greedy).install(monkeypatch)
    tr = run(lm, prompt, DSparkConfig(max_new_tokens=n, gamma=5, top_k_candidates=2, select="tree", budget=8,
                                      cost_table="none"), drafter=drafter)     # no overhead probe to record
    monkeypatch.undo()
    assert list(tr.output_ids) == greedy
    assert max(len(e.accepted_path) for e in tr.steps[1:]) >= 2       # multi-token rounds happened
    return greedy, recorder.calls


def mismatches(calls, prompt, rows) -> int:
    """Rounds whose history rows differ from training's rows for the same tokens. Row j of an answer
    is the state that produced answer token j; the prompt's last position produced answer token 0."""
    bad = 0
    for hidden, tokens, position in calls:
        n, first = len(tokens), position - len(prompt) - len(tokens)        # answer index of tokens[0]
        assert hidden.shape == (n, rows.shape[1])
        if not torch.allclose(hidden, rows[first:first + n], rtol=1e-3, atol=1e-3):
            bad += 1
    return bad


@pytest.mark.parametrize("layers", [(0,), (1, 0)])
def test_decoder_rows_equal_trainings_rows(lm, monkeypatch, layers):
    drafter = random_drafter(lm, gamma_max=6, layers=1, window=3, feature_layers=layers)
    prompts = [[3, 14, 15, 9], [7, 1]]                  # different lengths: training left-pads the second
    decoded = [decode_recorded(lm, drafter, p, monkeypatch) for p in prompts]
    rows = training_rows(lm, prompts, [answer for answer, _ in decoded], layers)
    for prompt, (_, calls), r in zip(prompts, decoded, rows):
        assert r.shape[1] == 32 * (1 + len(layers))
        assert max(len(t) for _, t, _ in calls) == drafter.span       # the window filled up
        assert mismatches(calls, prompt, r) == 0


def test_row_check_bites(lm, monkeypatch):
    """Negative control: a decoder that taps layer 1 where training read layer 0 fails the check."""
    drafter = random_drafter(lm, gamma_max=6, layers=1, window=3, feature_layers=(0,))
    real = tap_head_input
    monkeypatch.setattr(dspark, "tap_head_input", lambda model, layers=(): real(model, tuple(1 for _ in layers)))
    prompt = [3, 14, 15, 9]
    answer, calls = decode_recorded(lm, drafter, prompt, monkeypatch)
    rows = training_rows(lm, [prompt], [answer], (0,))[0]
    assert mismatches(calls, prompt, rows) == len(calls)


def test_feature_rows_change_the_drafts(lm):
    """The drafter reads its feature part: changing it changes the logits; the LM-head part is still
    what z starts from (zeroed per-position blocks give the target's own head on it)."""
    drafter = random_drafter(lm, gamma_max=4, feature_layers=(0, 1))
    gen = torch.Generator().manual_seed(0)
    rows, root = torch.randn(1, 96, generator=gen), torch.tensor([5])
    with torch.no_grad():
        base = drafter(rows, root).base
        moved = rows.clone()
        moved[0, 40] += 3.0                                   # inside layer 0's part
        assert not torch.allclose(drafter(moved, root).base, base)
        drafter.w2.zero_()
        head = lm.model.get_output_embeddings().weight
        torch.testing.assert_close(drafter(rows, root).base[0, 0], rows[0, :32] @ head.T, rtol=1e-5, atol=1e-5)


def test_features_round_trip_through_the_file(lm, tmp_path):
    drafter = random_drafter(lm, gamma_max=4, feature_layers=(1, 0))
    path = tmp_path / "d.safetensors"
    drafter.save(path)
    again = load_drafter(path, lm)
    assert again.shape == drafter.shape and again.shape.feature_layers == (1, 0)
    rows, root = torch.randn(2, 96), torch.tensor([5, 9])
    with torch.no_grad():
        torch.testing.assert_close(again(rows, root).base, drafter(rows, root).base, rtol=2e-2, atol=2e-2)


def test_layer_features_are_cached(lm, tmp_path):
    prompts = [[3, 14, 15], [7, 1, 2, 8]]
    data = generate_distill(lm, prompts, answer_tokens=6, batch_size=2, progress=False)
    first = layer_features(lm, prompts, data, (0, 1), progress=False)
    assert first.shape == (data.positions, 2, 32) and first.dtype == torch.float16
    assert len(list((tmp_path / "cache" / "distill").glob("layers-*.pt"))) == 1
    assert torch.equal(layer_features(lm, prompts, data, (0, 1), progress=False), first)
    assert not torch.equal(layer_features(lm, prompts, data, (1, 0), progress=False), first)


@pytest.mark.slow
def test_trained_feature_drafter_fits_and_stays_exact(lm, tmp_path):
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(1, 7))] for _ in range(16)]
    settings = TrainSettings(gamma_max=6, rank=8, trunk=32, width=32, steps=100, batch_size=64, lr=1e-2,
                             answer_tokens=20, gen_batch=8, heldout_every=4, feature_layers="0")
    out = tmp_path / "feat.safetensors"
    report = train_parallel(lm, settings, out, prompts=prompts, progress=False)
    drafter = load_drafter(out, lm)
    assert drafter.shape.feature_layers == (0,) and report.shape["feature_layers"] == (0,)
    data = generate_distill(lm, prompts, answer_tokens=20, batch_size=8, progress=False)
    data = drafter_data(lm, prompts, data, (0,), batch_size=8, progress=False)
    untrained = load_drafter(out, lm)
    with torch.no_grad():
        for p in (untrained.w2, untrained.seq_in, untrained.conf_w):
            p.zero_()
    slice_of = slice_index(drafter)
    assert (evaluate(drafter, data, 6, slice_of)["hits"].float().mean()
            > evaluate(untrained, data, 6, slice_of)["hits"].float().mean() + 0.1)
    assert ("at that position, the outputs of the target's decoder layers 0 (0-based)"
            in out.with_suffix(".md").read_text())
    for prompt in prompts[:3]:
        tr = run(lm, prompt, DSparkConfig(max_new_tokens=30, gamma=6, top_k_candidates=2), drafter=drafter)
        assert tr.output_ids == run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids


def test_bad_feature_layers_are_one_line(lm):
    cases = [lambda: DrafterShape(32, 64, feature_layers=(-1,)),
             lambda: DrafterShape(32, 64, feature_layers=(0, 0)),
             lambda: random_drafter(lm, feature_layers=(2,)),                # the tiny llama has 2 layers
             lambda: TrainSettings(feature_layers="7,x"),
             lambda: layer_features(lm, [[1, 2]], generate_distill(lm, [[1, 2]], answer_tokens=3, progress=False),
                                    (5,), progress=False)]
    for case in cases:
        with pytest.raises(ConfigError) as err:
            case()
        assert "feature" in str(err.value) or "drafter" in str(err.value)
        assert "\n" not in str(err.value)
    drafter = random_drafter(lm, feature_layers=(0,))
    with pytest.raises(ConfigError, match="rows must be 64 wide"):
        drafter(torch.randn(1, 32), torch.tensor([1]))


def test_tap_without_feature_layers_is_the_head_input(lm):
    with tap_head_input(lm) as plain, torch.no_grad():
        lm.forward([1, 2, 3], lm.new_cache())
    with tap_head_input(lm, (0,)) as both, torch.no_grad():
        lm.forward([1, 2, 3], lm.new_cache())
    assert plain.hidden.shape == (1, 3, 32) and both.hidden.shape == (1, 3, 64)
    torch.testing.assert_close(both.hidden[..., :32], plain.hidden)
    assert not torch.allclose(both.hidden[..., 32:], plain.hidden)
    assert dataclasses.asdict(DrafterShape(32, 64))["feature_layers"] == ()


def test_trainer_refuses_missing_layers_before_generating_data(lm, tmp_path, monkeypatch):
    """A layer the model lacks is a one-line error at once, not after the (long) data generation."""
    import decoding.train.parallel as train

    def no_data(*args, **kwargs):
        raise AssertionError("data generated before the layers were checked")

    monkeypatch.setattr(train, "distill_set", no_data)
    settings = TrainSettings(gamma_max=6, rank=8, trunk=32, width=32, steps=1, answer_tokens=4, feature_layers="0,5")
    with pytest.raises(ConfigError) as err:
        train_parallel(lm, settings, tmp_path / "x.safetensors", prompts=[[1, 2]], progress=False)
    assert str(err.value) == "feature_layers=[0, 5] is invalid: this model has 2 decoder layers (indices 0..1)"
