"""The feature drafter (decoding.drafters.feature_net) on tiny llamas: the LM-head input the verifier hands over is the
one a fresh full forward computes for that position (negative control: one position late differs);
speculative decoding with it is token-identical to greedy while it both accepts and rejects drafts;
sampled drafts stay in the slice with proper q_draft; weights round-trip; training raises the held-out
τ and the card reports it; the cost-aware policy times it; bad input gives one-line errors."""
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
from decoding.drafters.factory import load_draft, make_drafter
from decoding.drafters.feature import FeatureDrafter
from decoding.drafters.feature_net import FeatureNet, FeatureShape, load_feature, save_feature
from decoding.drafters.lookup import LookupThenDraftDrafter, PromptLookupDrafter
from decoding.runtime import packed_gemm
from decoding.runtime.hooks import tap_head_input
from decoding.runtime.models import LM
from decoding.train.feature import FeatureSettings, evaluate, leading_drafts, train_feature

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


cache_dir = pytest.fixture(scope="module", autouse=True)(module_cache)


@pytest.fixture(scope="module")
def lm() -> LM:
    return peaked_lm(0, vocab_size=32)


class Recorder(FeatureDrafter):
    """Keeps every (head input, context length) the verifier hands over."""

    def __init__(self, net):
        super().__init__(net)
        self.seen: list[tuple[torch.Tensor, int]] = []

    def observe(self, head_input, context_length):
        super().observe(head_input, context_length)
        self.seen.append((head_input.clone(), context_length))


def head_input_at(lm: LM, ids: list[int], position: int) -> torch.Tensor:
    """The LM-head input at `position` of a fresh full forward over `ids`."""
    with tap_head_input(lm) as tap:
        lm.forward(ids, lm.new_cache())
    return tap.hidden[0, position]


def test_handed_over_row_is_the_one_that_produced_the_last_token(lm):
    prompt = [3, 1, 4, 1, 5]
    drafter = Recorder(random_net(lm))
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=3), drafter=drafter)
    ids = prompt + list(trace.output_ids)
    assert len(drafter.seen) == len(trace.steps) >= 4
    for row, length in drafter.seen[:-1]:
        exact = head_input_at(lm, ids, length - 2)       # position length−2 predicts token length−1
        assert torch.allclose(row, exact, atol=1e-4), length
        late = head_input_at(lm, ids, length - 1)         # negative control: one position late
        assert not torch.allclose(row, late, atol=1e-2), length


def test_greedy_identity_with_accepts_and_rejects(lm):
    prompt = [2, 7, 1, 8, 2, 8]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=40)).output_ids
    seen_accept = seen_reject = False
    for seed, gamma in ((0, 1), (1, 3), (2, 5)):
        trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=40, draft="feature", gamma=gamma),
                           drafter=FeatureDrafter(random_net(lm, seed)))
        assert trace.error is None
        assert not divergence(lm, prompt, expected, trace.output_ids), divergence(lm, prompt, expected,
                                                                                  trace.output_ids)
        assert not trace.steps[0].drafts            # no head input yet: the first round verifies the prompt only
        verdicts = [d.verdict for r in trace.steps for d in r.drafts]
        seen_accept |= "accepted" in verdicts
        seen_reject |= "rejected" in verdicts
    assert seen_accept and seen_reject


def test_a_row_for_another_context_drafts_nothing(lm):
    """A head input handed over for another context length (here: one token longer) is never used: the
    drafter proposes nothing rather than draft from a row that did not produce the context's last token;
    the output stays greedy's."""
    class Late(FeatureDrafter):
        def observe(self, head_input, context_length):
            super().observe(head_input, context_length + 1)   # never matches the next context: no drafts

    prompt = [5, 5, 6]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=16)).output_ids
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=16, draft="feature", gamma=3),
                       drafter=Late(random_net(lm)))
    assert list(trace.output_ids) == list(expected)
    assert all(not r.drafts for r in trace.steps)


def test_sampled_drafts_stay_in_the_slice(lm):
    ids = list(range(0, 32, 2))
    trace = runner.run(lm, [1, 2, 3], SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=4, temperature=1.0,
                                                         seed=3), drafter=FeatureDrafter(random_net(lm, vocab=ids)))
    drafted = [d.token_id for r in trace.steps for d in r.drafts]
    assert drafted and all(t in ids for t in drafted)
    assert all(0 < d.q_draft <= 1 for r in trace.steps for d in r.drafts)


def test_greedy_proposal_is_the_full_vocabulary_chain(lm):
    """At temperature 0 the drafter argmaxes over the slice and spreads q_draft once at the end; that
    equals the plain chain: full-vocabulary logits (−inf outside the slice), argmax, softmax, per step."""
    from decoding.core.processors import Pipeline
    from decoding.drafters.base import DraftRequest

    net = random_net(lm, seed=5, vocab=list(range(1, 32, 3)))
    drafter = FeatureDrafter(net)
    row, context = torch.randn(int(lm.model.config.hidden_size)), [4, 9, 2]
    drafter.observe(row, len(context))
    proposal = drafter.propose(context, DraftRequest(4, Pipeline(()), True, torch.Generator(), None))
    feature, token, tokens, rows = row, torch.tensor(context[-1]), [], []
    with torch.inference_mode():
        for _ in range(len(proposal.tokens)):
            feature = net.step(feature, token)
            logits = net.full_logits(feature)                               # (V,)
            token = torch.argmax(logits)
            tokens.append(int(token)), rows.append(logits.softmax(-1))
    assert len(tokens) == 4 and len(set(tokens)) > 1
    assert list(proposal.tokens) == tokens
    assert torch.allclose(proposal.q_draft, torch.stack(rows), atol=1e-6)
    assert proposal.draft_draws == (None,) * 4


def test_lookup_then_feature_hands_rows_on(lm):
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=30)).output_ids
    inner = Recorder(random_net(lm))
    drafter = LookupThenDraftDrafter(PromptLookupDrafter(2), inner)
    assert drafter.reads_target
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=30, draft="lookup+feature", gamma=3),
                       drafter=drafter)
    assert list(trace.output_ids) == list(expected)
    assert len(inner.seen) == len(trace.steps)
    sources = {r.drafter for r in trace.steps if r.drafts}
    assert sources == {"lookup", inner.name}, sources        # both took turns, and each round verified exactly


def test_weights_round_trip_and_load_errors(lm, tmp_path):
    net = random_net(lm, 4, vocab=list(range(20)))
    path = tmp_path / "f.safetensors"
    save_feature(net, path, meta={"target": lm.name})
    again = load_feature(lm, path)
    f, x = torch.randn(int(lm.model.config.hidden_size), device=lm.device), torch.tensor(3, device=lm.device)
    assert torch.allclose(again.slice_logits(again.step(f.to(again.dtype), x)).float(),
                          net.slice_logits(net.step(f, x)).float(),
                          atol=2e-2, rtol=2e-3)                   # float16 file
    assert again.vocab_ids.tolist() == list(range(20))
    assert isinstance(load_draft(f"feature:{path}", lm), FeatureNet)
    assert isinstance(make_drafter("feature", lm, drafter=again), FeatureDrafter)
    with pytest.raises(ConfigError, match="^draft=.*train one with `python -m decoding train feature`"):
        load_feature(lm, tmp_path / "missing.safetensors")
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(other), metadata={"format": "something-else"})
    with pytest.raises(ConfigError, match="is not a feature-drafter weights file"):
        load_feature(lm, other)
    with pytest.raises(ConfigError, match="hidden size"):
        FeatureNet(FeatureShape(8), range(4)).attach(lm)


def test_loaded_net_computes_in_the_targets_dtype_on_its_kernels(lm, tmp_path, monkeypatch):
    """load_feature runs every matmul (the linear layers and the head slice) in the target's dtype
    through the target's CPU GEMM plan, so a drafter gives the same numbers on every CPU up to float32
    rounding: its step and logits equal plain F.linear's on the file's weights to 1e-5, and a greedy run
    with it stays identical to plain greedy. Control: the same weights' float16 matmuls (how loaded
    drafters ran before; they moved by 1e-3 between two CPUs) miss that bound."""
    kernel = packed_gemm.kernels_here()[-1]
    monkeypatch.setattr(lm, "gemm_plan", packed_gemm.GemmPlan((1,), (kernel,)), raising=False)
    path = tmp_path / "f.safetensors"
    save_feature(random_net(lm, 5), path, meta={"target": lm.name})
    loaded = load_feature(lm, path)
    linears = [m for m in loaded.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == lm.dtype for m in linears) and loaded.head.dtype == lm.dtype
    if packed_gemm.available():
        assert all(type(m) is packed_gemm.PackedLinear and m.plan == lm.gemm_plan for m in linears)
    assert loaded.gemm_plan == lm.gemm_plan
    plain = load_feature(lm, path)
    packed_gemm.unpack_linears(plain)
    plain.gemm_plan, plain.head_pack = packed_gemm.DEFAULT_PLAN, None
    half = load_feature(lm, path)
    packed_gemm.unpack_linears(half)
    half.gemm_plan, half.head_pack = packed_gemm.DEFAULT_PLAN, None
    for module in half.modules():
        if isinstance(module, torch.nn.Linear):
            module.half()
    half.head = half.head.half()
    f, x = torch.randn(3, int(lm.model.config.hidden_size), device=lm.device), torch.tensor([7, 2, 9])
    reference = plain.slice_logits(plain.step(f, x))
    assert torch.allclose(loaded.slice_logits(loaded.step(f, x)), reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(half.slice_logits(half.step(f, x)), reference, atol=1e-5, rtol=1e-5)
    prompt = [3, 1, 4, 1, 5]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=24)).output_ids
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=24, draft="feature", gamma=3), drafter=loaded)
    assert trace.error is None and list(trace.output_ids) == list(expected)


def test_cost_policy_times_the_feature_drafter(lm):
    drafter = FeatureDrafter(random_net(lm))
    ms = drafter.token_ms(lm)
    assert list(ms) == [drafter.name] and 0 < ms[drafter.name] < 1000
    prompt = [4, 4, 2]
    expected = runner.run(lm, prompt, GreedyConfig(max_new_tokens=20)).output_ids
    trace = runner.run(lm, prompt, SpeculativeConfig(max_new_tokens=20, draft="feature", gamma=4, gamma_policy="cost"),
                       drafter=drafter)
    assert trace.error is None and list(trace.output_ids) == list(expected)


@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
@pytest.mark.slow
def test_training_raises_tau_and_writes_the_card(tmp_path, autocast):
    from drafter_support import tiny4_lm

    lm = tiny4_lm()          # a random tiny llama: its answers are far less repetitive than the peaked one's
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(2, 6))] for _ in range(48)]
    settings = FeatureSettings(width=64, mlp=128, blocks=1, unroll=3, steps=300, batch_size=128, lr=3e-3,
                               answer_tokens=24, gen_batch=16, heldout_every=4, autocast=autocast)
    out = tmp_path / "feature.safetensors"
    report = train_feature(lm, settings, out, prompts=prompts, progress=False)
    # 36 training answers of a random target do not generalise (held-out τ is the real model's test,
    # tests/test_speculative_real.py); training must fit them, and the card must say so
    before, fit = report.before["tau_chain"][3], report.train_metrics["tau_chain"][3]
    assert fit > before + 1.0, (before, fit)
    card = out.with_suffix(".md").read_text()
    assert f"{report.after['tau_chain'][5]:.2f}" in card and f"{fit:.2f}" in card and "--width 64" in card
    assert ("--autocast bfloat16" in card) == (autocast == "bfloat16")
    net = load_feature(lm, out)
    # the report's held-out τ is what a greedy run's drafts would meet: recount on one answer
    from decoding.train.data import generate_distill
    data = generate_distill(lm, prompts[:1], answer_tokens=24, progress=False, use_cache=False)
    lead, full, _ = leading_drafts(net.float(), data, 3)
    assert lead.max() <= 3 and len(lead) == data.positions - 1
    assert evaluate(net, data)["positions"] == data.positions - 1


def test_bad_settings_name_the_parameter():
    with pytest.raises(ConfigError, match="^unroll=0"):
        FeatureSettings(unroll=0)
    with pytest.raises(ConfigError, match="^blocks=-1"):
        FeatureSettings(blocks=-1)
    with pytest.raises(ConfigError, match="^autocast='float16'"):
        FeatureSettings(autocast="float16")
    with pytest.raises(ConfigError, match="^decay=0"):
        FeatureSettings(decay=0.0)
    with pytest.raises(ConfigError, match="^noise=-0.1"):
        FeatureSettings(noise=-0.1)
    with pytest.raises(ConfigError, match="^heldout_every=1 .*>= 2"):      # the shared data settings' check
        FeatureSettings(heldout_every=1)


def test_eval_feature_reports_each_kind_of_part_on_its_held_out_sequences(lm, tmp_path, capsys):
    from decoding.train import feature_eval
    from decoding.train.data import DistillData, generate_distill

    rng = random.Random(1)
    parts = [[[rng.randrange(32) for _ in range(3)] for _ in range(n)] for n in (8, 4, 4, 4, 4)]
    data = DistillData.concat([generate_distill(lm, p, answer_tokens=10, progress=False, use_cache=False)
                               for p in parts])
    groups = feature_eval.held_by_kind(data, 4)
    assert groups == {"templated": [3, 7], "varied": [11, 15], "follow-up": [19, 23]}
    path = tmp_path / "f.safetensors"
    save_feature(random_net(lm, vocab=range(lm.vocab_size)), path, meta={"target": lm.name})
    rows = feature_eval.evaluate_files(lm, data, 4, [str(path)])
    net = load_feature(lm, path).float()
    assert [kind for _, kind, _ in rows] == list(feature_eval.KINDS)
    for _, kind, metrics in rows:           # each kind: the trainer's metric on exactly its held-out sequences
        assert metrics == evaluate(net, data.subset(groups[kind]))
    other = evaluate(net, data.subset([0, 1]))
    assert any(m != other for _, _, m in rows)                    # control: other sequences measure otherwise
    table = feature_eval.render(rows)
    assert table.count(str(path)) == 3 and "| follow-up |" in table
    assert feature_eval.main_eval_feature(["--model", str(tmp_path / "none"), "--weights", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: model=")


def test_training_device_is_checked_and_the_card_names_the_machine(tmp_path):
    from conftest import TEST_DEVICE
    from drafter_support import tiny4_lm

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^device='cuda' is invalid: must be cpu, or cuda on a machine"):
            FeatureSettings(device="cuda")
    with pytest.raises(ConfigError, match="^device='tpu'"):
        FeatureSettings(device="tpu")
    lm = tiny4_lm()
    rng = random.Random(1)
    prompts = [[rng.randrange(64) for _ in range(rng.randint(2, 6))] for _ in range(16)]
    small = {"width": 32, "mlp": 64, "blocks": 1, "unroll": 2, "steps": 30, "batch_size": 64, "answer_tokens": 12,
             "gen_batch": 16, "heldout_every": 4}
    reports = {}
    for device in dict.fromkeys(["cpu", str(TEST_DEVICE)]):      # the GPU check trains on cuda as well
        out = tmp_path / f"{device}.safetensors"
        reports[device] = train_feature(lm, FeatureSettings(**small, device=device), out, prompts=prompts,
                                        progress=False)
        assert "s on " + reports[device].machine in out.with_suffix(".md").read_text()
        assert load_feature(lm, out).vocab_ids.device.type == "cpu"
    assert "threads" in reports["cpu"].machine
    for device, report in reports.items():     # the same run on another device: the same loss up to rounding
        assert report.final_loss == pytest.approx(reports["cpu"].final_loss, rel=0.02), device


def test_a_bad_model_dtype_is_one_line(tmp_path, capsys):
    from decoding.train.feature import main_train_feature

    assert main_train_feature(["--model-dtype", "float8", "--out", str(tmp_path / "f.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dtype='float8' is invalid") and err.count("\n") == 1


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 19, 20, 21, 40, 2000])
def test_the_schedule_takes_any_step_count(steps):
    from decoding.train.feature import one_cycle

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    sched = one_cycle(opt, 1e-3, steps)
    rates = []
    for _ in range(steps):                  # as the trainer steps it
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(rates) <= 1e-3 * (1 + 1e-9) and min(rates) > 0
    if steps >= 4:
        assert max(rates) == pytest.approx(1e-3) and rates[-1] < 1e-4       # warmed up, then annealed
