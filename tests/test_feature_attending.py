"""The attending feature drafter (decoding.drafters.feature_net with shape.heads > 0) on tiny llamas.

- `unrolled` (training and evaluation: every draft step from every anchor at once) equals drafting one
  step at a time with `context_step` and a growing cache; negative control: letting step s read the
  true keys past its anchor changes the result.
- The rows the verifier hands over (`observe_rows`) are the fresh forward's LM-head inputs at their
  positions; speculative decoding with the drafter is token-identical to greedy while it accepts and
  rejects; sampled drafts have proper q_draft; a gap in the rows drafts nothing.
- The training layout puts (f_t, x_{t+1}) at index t with the label x_{t+2}; the prompt rows equal a
  fresh forward's; training fits its data and the card says the drafter attends.
"""
from __future__ import annotations

import random

import pytest
import torch
from drafter_support import random_net
from dspark_helpers import module_cache, one_thread
from spec_helpers import divergence, peaked_lm

from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.drafters.factory import make_drafter
from decoding.drafters.feature import AttendingDrafter
from decoding.drafters.feature_net import FeatureNet, FeatureShape, load_feature, unrolled
from decoding.runtime.hooks import tap_decoder_rows
from decoding.runtime.models import LM
from decoding.train.attending import layout
from decoding.train.context_rows import prompt_rows
from decoding.train.data import generate_distill
from decoding.train.feature import FeatureSettings, train_feature

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
cache_dir = pytest.fixture(scope="module", autouse=True)(module_cache)


@pytest.fixture(scope="module")
def lm() -> LM:
    return peaked_lm(0, vocab_size=32)


def attending_net(lm: LM, seed: int = 0, vocab=None) -> FeatureNet:
    return random_net(lm, seed, vocab, width=24, heads=2, head_dim=8)


def sequential(net: FeatureNet, feats, toks, anchor: int, steps: int, own: bool) -> list[torch.Tensor]:
    """Drafting as the drafter does: read pairs 0..anchor, then one context_step per draft."""
    pred, keys, values = net.context_step(feats[:anchor + 1], toks[:anchor + 1], None, None)
    feature, out = pred[-1], []
    for s in range(steps):
        out.append(feature)
        t = anchor + s
        if t + 1 >= len(toks):
            break
        token = net.vocab_ids[net.slice_logits(feature).argmax()][None] if own else toks[t + 1:t + 2]
        nxt, k, v = net.context_step(feature[None], token, keys, values)
        feature, keys, values = nxt[0], torch.cat([keys, k], 1), torch.cat([values, v], 1)
    return out


@pytest.mark.parametrize("own", [False, True])
def test_unrolled_equals_step_by_step_drafting(lm, own):
    net = attending_net(lm, seed=1)
    T, steps, base = 11, 4, 2
    device = net.head.device
    feats = torch.randn(1, T, int(lm.model.config.hidden_size)).to(device)
    toks = torch.randint(0, lm.vocab_size, (1, T)).to(device)
    with torch.inference_mode():
        outs = unrolled(net, feats, toks, steps, base=base, own_tokens=own)
        for anchor in range(base, T):
            for s, feature in enumerate(sequential(net, feats[0], toks[0], anchor, steps, own), start=1):
                assert torch.allclose(outs[s - 1][0, anchor + s - 1 - base], feature, atol=1e-5), (anchor, s)


def test_unrolled_negative_control_reading_past_the_anchor(lm, monkeypatch):
    """With a mask that lets step s ≥ 2 read the true keys up to its own index (not only up to its
    anchor), the comparison with step-by-step drafting fails: the test above can see a wrong mask."""
    import decoding.drafters.feature_net as feature_mod

    monkeypatch.setattr(feature_mod, "true_keys",
                        lambda t, T, s: torch.arange(T, device=t.device)[None, :] <= t[:, None])
    with pytest.raises(AssertionError):
        test_unrolled_equals_step_by_step_drafting(lm, own=False)


class RowRecorder(AttendingDrafter):
    def __init__(self, net):
        super().__init__(net)
        self.seen: list[tuple[torch.Tensor, int]] = []

    def observe_rows(self, rows, first_position):
        super().observe_rows(rows, first_position)
        self.seen.append((rows.clone(), first_position))


def fresh_rows(lm: LM, ids: list[int]) -> torch.Tensor:
    with tap_decoder_rows(lm) as tap:
        lm.forward(ids, lm.new_cache())
    return tap.rows[0]                                                    # (T, H)


def test_rows_handed_over_are_the_fresh_forward_rows(lm):
    prompt = [3, 1, 4, 1, 5, 9]
    drafter = RowRecorder(attending_net(lm))
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=3), drafter=drafter)
    ids = prompt + list(trace.output_ids)
    exact = fresh_rows(lm, ids)
    assert drafter.seen[0][1] == 0 and len(drafter.seen[0][0]) == len(prompt)      # the prefill: every prompt row
    position = 0
    for rows, first in drafter.seen:
        assert first == position                          # contiguous: no row missing or repeated
        assert torch.allclose(rows, exact[first:first + len(rows)].to(rows.device), atol=1e-4), first
        position += len(rows)
    assert position == len(ids) - 1                       # rows for every position but the last token's


@pytest.mark.slow
def test_greedy_identity_with_accepts_and_rejects(lm):
    prompt = [2, 7, 1, 8, 2, 8]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=40)).output_ids
    verdicts = []
    for seed, gamma in ((0, 1), (1, 3), (2, 5)):
        net = attending_net(lm, seed)
        trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=40, draft="feature", gamma=gamma),
                           drafter=make_drafter("feature", lm, drafter=net))
        assert trace.error is None
        assert not divergence(lm, prompt, expected, trace.output_ids), divergence(lm, prompt, expected,
                                                                                  trace.output_ids)
        assert not trace.steps[0].drafts
        verdicts += [d.verdict for r in trace.steps for d in r.drafts]
    assert "accepted" in verdicts and "rejected" in verdicts


def test_sampled_drafts_are_proper_distributions(lm):
    ids = list(range(0, 32, 2))
    trace = runner.run(lm, [1, 2, 3], SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=4, temperature=1.0,
                                                         seed=3),
                       drafter=AttendingDrafter(attending_net(lm, vocab=ids)))
    drafted = [d for r in trace.steps for d in r.drafts]
    assert drafted and all(d.token_id in ids and 0 < d.q_draft <= 1 for d in drafted)
    assert all(abs(sum(c.prob for c in d.draft_top) - 1) < 1e-4 or len(d.draft_top) < len(ids) for d in drafted)


def test_a_gap_in_the_rows_drafts_nothing(lm):
    drafter = AttendingDrafter(attending_net(lm))
    drafter.start([1, 2, 3])
    hidden = int(lm.model.config.hidden_size)
    drafter.observe_rows(torch.randn(3, hidden), 0)
    drafter.observe_rows(torch.randn(2, hidden), 5)          # positions 3, 4 never handed over
    from decoding.core.processors import Pipeline
    from decoding.drafters.base import DraftRequest

    request = DraftRequest(3, Pipeline(()), True, torch.Generator(), None)
    assert drafter.propose([1, 2, 3, 4, 5, 6, 7, 8], request).tokens == ()
    drafter.observe_rows(torch.randn(4, hidden), 0)          # a fresh start from position 0 drafts again
    assert len(drafter.propose([1, 2, 3, 4, 5], request).tokens) == 3


def test_layout_and_prompt_rows(lm, tmp_path):
    prompts = [[5, 3, 9, 1], [7, 2, 2, 8, 4, 6]]
    data = generate_distill(lm, prompts, answer_tokens=6, batch_size=2, progress=False)
    rows, offsets = prompt_rows(lm, prompts, progress=False, use_cache=False)
    lay = layout(data, prompts, rows, offsets)
    for s, prompt in enumerate(prompts):
        seq = list(prompt) + data.answer(s)
        exact = fresh_rows(lm, seq).cpu()                                      # f_t for every position t
        a, b = int(lay.offsets[s]), int(lay.offsets[s + 1])
        assert b - a == len(seq) - 1
        assert torch.allclose(lay.features[a:b].float(), exact[:len(seq) - 1], atol=2e-2)   # float16 rows
        assert lay.tokens[a:b].tolist() == seq[1:]
        labelled = [(t, int(r)) for t, r in enumerate(lay.answer_row[a:b]) if r >= 0]
        assert [t for t, _ in labelled] == list(range(len(prompt) - 2, len(seq) - 2))
        assert all(int(data.tokens[r]) == seq[t + 2] for t, r in labelled)


@pytest.mark.slow
def test_training_fits_and_the_card_says_it_attends(tmp_path):
    from drafter_support import tiny4_lm

    lm = tiny4_lm()
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(2, 6))] for _ in range(48)]
    settings = FeatureSettings(width=64, mlp=128, blocks=1, unroll=3, steps=300, lr=3e-3, answer_tokens=24,
                               gen_batch=16, heldout_every=4, heads=2, head_dim=16, seqs=8)
    out = tmp_path / "attending.safetensors"
    report = train_feature(lm, settings, out, prompts=prompts, progress=False)
    assert report.train_metrics["top1"] > report.before["top1"] + 0.3
    assert report.train_metrics["tau_chain"][3] > 2.0
    card = out.with_suffix(".md").read_text()
    assert "attention" in card and "--heads 2" in card
    net = load_feature(lm, out)
    assert net.attends and isinstance(make_drafter("feature", lm, drafter=net), AttendingDrafter)
    expected = runner.run(lm, prompts[0], GreedyConfig(max_new_tokens=24)).output_ids
    trace = runner.run(lm, prompts[0], SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=3), drafter=net)
    assert list(trace.output_ids) == list(expected) and trace.stats.mean_accepted_length > 1.5


def test_bad_settings_name_the_parameter():
    with pytest.raises(ConfigError, match="^heads=-1"):
        FeatureSettings(heads=-1)
    with pytest.raises(ConfigError, match="^seqs=0"):
        FeatureSettings(seqs=0)
    with pytest.raises(ConfigError, match="^heads=-2"):
        FeatureShape(8, heads=-2)
    with pytest.raises(ConfigError, match="^init='/no/such.safetensors' is invalid: is not a file"):
        FeatureSettings(init="/no/such.safetensors")


def test_lookup_in_front_and_the_cost_policy(lm):
    """Behind prompt lookup the drafter still gets every row (it catches up on lookup rounds' pairs) and
    stays greedy-identical; the cost-aware γ policy times its draft step."""
    from decoding.drafters.lookup import LookupThenDraftDrafter, PromptLookupDrafter

    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
    inner = RowRecorder(attending_net(lm))
    drafter = LookupThenDraftDrafter(PromptLookupDrafter(2), inner)
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=30, draft="lookup+feature", gamma=3),
                       drafter=drafter)
    assert list(trace.output_ids) == list(expected)
    assert {r.drafter for r in trace.steps if r.drafts} == {"lookup", inner.name}
    assert sum(len(rows) for rows, _ in inner.seen) == len(prompt) + len(trace.output_ids) - 1
    timed = AttendingDrafter(attending_net(lm, seed=3))
    ms = timed.token_ms(lm)
    assert list(ms) == [timed.name] and 0 < ms[timed.name] < 1000
    cost = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=20, draft="feature", gamma=4, gamma_policy="cost"),
                      drafter=timed)
    assert cost.error is None and list(cost.output_ids) == list(expected[:20])


@pytest.mark.parametrize("attending", [False, True])
def test_forced_tokens_and_a_forced_eos(attending):
    """A branch (forced tokens after the prompt) equals greedy from prompt + forced; a forced EOS ends
    the run at once, with no rows to hand over (nothing kept) and no error."""
    lm = peaked_lm(0, vocab_size=32, eos_token_id=31)
    net = attending_net(lm) if attending else random_net(lm)
    prompt, forced = [4, 8, 15], [16, 23]
    expected = runner.run(lm, prompt + forced, GreedyConfig(max_new_tokens=18)).output_ids
    config = SpeculativeConfig(max_new_tokens=20, draft="feature", gamma=3)
    trace = runner.run(lm, prompt, config, drafter=make_drafter("feature", lm, drafter=net), forced=forced)
    assert trace.error is None
    assert list(trace.output_ids) == forced + list(expected)[:len(trace.output_ids) - 2]
    assert len(trace.output_ids) == 20 or trace.output_ids[-1] == 31
    ended = runner.run(lm, prompt, config, drafter=make_drafter("feature", lm, drafter=net), forced=[31])
    assert ended.error is None and list(ended.output_ids) == [31]


@pytest.mark.slow
def test_init_from_a_plain_drafter_starts_where_it_ended(tmp_path):
    """--init: an attending net built from a trained plain drafter's file drafts exactly as that drafter
    before its first step (the new attention layer's output map is zero), so fine-tuning starts from it;
    a file of another shape is a one-line error naming `init`."""
    from drafter_support import tiny4_lm

    from decoding.train.feature import start_from

    lm = tiny4_lm()
    rng = random.Random(1)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(2, 6))] for _ in range(24)]
    common = {"width": 32, "mlp": 64, "blocks": 1, "unroll": 2, "lr": 3e-3, "answer_tokens": 16, "gen_batch": 12,
              "heldout_every": 4}
    plain_file = tmp_path / "plain.safetensors"
    plain = train_feature(lm, FeatureSettings(steps=60, batch_size=64, **common), plain_file, prompts=prompts,
                          progress=False)
    attending = train_feature(lm, FeatureSettings(steps=1, heads=2, head_dim=8, init=str(plain_file), **common),
                              tmp_path / "att.safetensors", prompts=prompts, progress=False)
    assert attending.before["tau_chain"] == pytest.approx(plain.after["tau_chain"], abs=1e-9)
    assert attending.before["top1"] == pytest.approx(plain.after["top1"], abs=1e-9)
    other = FeatureNet(FeatureShape(int(lm.model.config.hidden_size), width=48, mlp=64, blocks=1, heads=2), range(8))
    with pytest.raises(ConfigError, match="^init=.*does not fit"):
        start_from(other, str(plain_file))
    with pytest.raises(ConfigError, match="^init=.*is not a file"):
        start_from(other, str(tmp_path / "missing.safetensors"))
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"), metadata={"format": "something-else"})
    with pytest.raises(ConfigError, match="^init=.*is not a feature-drafter weights file"):
        start_from(other, str(tmp_path / "other.safetensors"))
