"""MKL packed GEMM (decoding/runtime/packed_gemm.py): same numbers as nn.Linear, never a stale pack, the plain
path where the pack cannot serve, and a loaded model that says it is packed."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from gemm_support import cpu_llama, linear, packed_copy
from torch import nn

from decoding.core.errors import ConfigError
from decoding.runtime import packed_gemm
from decoding.runtime.cost_table import auto_cost_path
from decoding.runtime.models import LM, ModelSpec
from decoding.runtime.packed_gemm import PACK_MIN_ROWS, PackedLinear, pack_linears, packed_count, unpack_linears

pytestmark = pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")


def packed_path_calls(monkeypatch) -> list[int]:
    """Rows of every call that reached MKL's packed op."""
    calls: list[int] = []
    real = packed_gemm.packed_linear

    def spy(x, pack, weight, bias=None):
        calls.append(x.shape[0])
        return real(x, pack, weight, bias)

    monkeypatch.setattr(packed_gemm, "packed_linear", spy)
    return calls


@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_packed_linear_matches_nn_linear_for_every_row_count(monkeypatch, bias):
    plain = linear(bias=bias)
    packed = packed_copy(plain)
    calls = packed_path_calls(monkeypatch)
    for rows in range(1, 20):
        x = torch.randn(rows, plain.in_features)
        want, got = plain(x), packed(x)
        assert got.shape == want.shape
        if rows < PACK_MIN_ROWS:
            assert torch.equal(got, want)                 # the plain path itself
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == list(range(PACK_MIN_ROWS, 20))       # the packed op served every count from 4 on


@torch.no_grad()
def test_packed_linear_keeps_leading_dimensions(monkeypatch):
    plain = linear()
    packed = packed_copy(plain)
    calls = packed_path_calls(monkeypatch)
    x = torch.randn(2, 3, plain.in_features)                                   # (B, T, in): 6 rows
    torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    assert calls == [6]


def load_in_place(module: nn.Linear, other: nn.Linear) -> None:
    module.load_state_dict(other.state_dict())            # copies into the same storage


def replace(module: nn.Linear, other: nn.Linear) -> None:
    module.weight = nn.Parameter(other.weight.detach().clone())
    module.bias = nn.Parameter(other.bias.detach().clone())


@pytest.mark.parametrize("change", [load_in_place, replace], ids=["in place", "replaced"])
@torch.no_grad()
def test_a_changed_weight_is_not_served_from_the_old_pack(monkeypatch, change):
    packed = packed_copy(linear(seed=0))
    other = linear(seed=1)
    change(packed, other)
    calls = packed_path_calls(monkeypatch)
    x = torch.randn(8, other.in_features)
    assert torch.equal(packed(x), other(x)) and calls == []    # plain path, the new weight
    packed.repack()
    torch.testing.assert_close(packed(x), other(x), rtol=1e-5, atol=1e-5)
    assert calls == [8]


def test_autograd_takes_the_plain_path_and_gets_gradients(monkeypatch):
    packed = packed_copy(linear())
    calls = packed_path_calls(monkeypatch)
    x = torch.randn(8, packed.in_features, requires_grad=True)
    packed(x).sum().backward()
    assert calls == [] and x.grad is not None and packed.weight.grad is not None


@torch.no_grad()
def test_other_dtypes_take_the_plain_path(monkeypatch):
    packed = packed_copy(linear())
    packed.double()                                        # new weight tensors: the pack no longer applies
    calls = packed_path_calls(monkeypatch)
    x = torch.randn(8, packed.in_features, dtype=torch.float64)
    assert packed(x).dtype == torch.float64 and calls == []


@pytest.mark.parametrize("copy_of", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
@torch.no_grad()
def test_copies_carry_the_weight_and_pack_again(monkeypatch, copy_of):
    packed = packed_copy(linear())
    twin = copy_of(packed)
    assert type(twin) is PackedLinear and twin.weight.data_ptr() != packed.weight.data_ptr()
    calls = packed_path_calls(monkeypatch)
    x = torch.randn(8, packed.in_features)
    assert torch.equal(twin(x), packed(x)) and calls == [8, 8]
    with torch.no_grad():
        twin.weight.add_(1.0)                              # the copy's own weight; the original's pack stands
    torch.testing.assert_close(packed(x), linear()(x), rtol=1e-5, atol=1e-5)


def test_only_fp32_cpu_linears_are_packed():
    model = nn.Sequential(linear(), nn.Linear(40, 8).double(), nn.Embedding(10, 4))
    assert pack_linears(model) == 1
    assert [type(m).__name__ for m in model] == ["PackedLinear", "Linear", "Embedding"]


@torch.no_grad()
def test_a_packed_tiny_llama_gives_the_same_logits_and_greedy_tokens():
    plain = cpu_llama(hidden=64, layers=2)
    packed = cpu_llama(hidden=64, layers=2)
    keys = list(packed.state_dict())
    assert pack_linears(packed) == packed_count(packed) > 0
    assert list(packed.state_dict()) == keys                # no new state: checkpoints unchanged
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])                  # 10 rows: the packed path
    torch.testing.assert_close(packed(ids).logits, plain(ids).logits, rtol=1e-5, atol=1e-5)
    kwargs = {"do_sample": False, "max_new_tokens": 12, "attention_mask": torch.ones_like(ids)}
    assert torch.equal(packed.generate(ids, **kwargs), plain.generate(ids, **kwargs))
    assert unpack_linears(packed) == len([m for m in plain.modules() if isinstance(m, nn.Linear)])
    assert packed_count(packed) == 0 and all(type(m) is not PackedLinear for m in packed.modules())


def test_the_lm_records_its_gemm_and_its_cost_table_is_its_own():
    model = cpu_llama()
    plain = LM(model, tokenizer=None, name="tiny-gemm")
    plain_path = auto_cost_path(plain)
    pack_linears(model)
    packed = LM(model, tokenizer=None, name="tiny-gemm")
    assert plain.packed_linears == 0 and packed.packed_linears == packed_count(model) > 0
    assert packed.describe() == plain.describe()           # traces do not depend on the GEMM
    assert auto_cost_path(packed) != plain_path            # times of one GEMM never price the other


def test_pack_gemm_must_be_a_bool():
    with pytest.raises(ConfigError) as err:
        ModelSpec(pack_gemm="yes")
    assert err.value.param == "pack_gemm" and "'yes'" in str(err.value)


@pytest.mark.slow
def test_the_embedded_model_loads_packed_unless_told_not_to(real_lm):
    from decoding.runtime.models import load

    assert real_lm.packed_linears == sum(isinstance(m, nn.Linear) for m in real_lm.model.modules())
    plain = load(ModelSpec(pack_gemm=False))
    assert plain.packed_linears == 0
    ids = real_lm.encode("Name three colours.")
    with torch.no_grad():
        a = real_lm.model(torch.tensor([ids])).logits[0]
        b = plain.model(torch.tensor([ids])).logits[0]
    # float32 GEMMs in another summation order over 30 layers: the error scales with the logits' size,
    # not with each element's (near-zero logits carry the same absolute error as large ones)
    assert float((a - b).abs().max()) <= 2e-5 * float(b.abs().max())
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_packing_again_repacks_only_the_stale_modules():
    model = nn.Sequential(linear(seed=0), linear(40, 40, seed=1))
    assert pack_linears(model) == 2
    with torch.no_grad():
        model[1].weight.mul_(2.0)
    assert not model[1].pack_is_current() and model[0].pack_is_current()
    assert pack_linears(model) == 1 and model[1].pack_is_current()


@torch.no_grad()
def test_a_shallow_draft_on_a_packed_target_packs_its_trained_layers(tmp_path, monkeypatch):
    from decoding.drafters.shallow import build_shallow, load_shallow, save_shallow

    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    model = cpu_llama(layers=3)
    pack_linears(model)
    target = LM(model, tokenizer=None, name="tiny-packed")
    trained = build_shallow(target, 1, 1)
    for p in trained.model.model.layers[1].parameters():
        p.add_(0.01 * torch.randn_like(p))                 # stands for training
    save_shallow(trained, tmp_path / "draft.safetensors")
    draft = load_shallow(target, tmp_path / "draft.safetensors")
    adapter = [m for m in draft.model.model.layers[1].modules() if isinstance(m, nn.Linear)]
    assert adapter and all(type(m) is PackedLinear and m.pack_is_current() for m in adapter)
    assert draft.model.model.layers[0] is model.model.layers[0]          # shared, still the target's pack
    ids = list(range(3, 13))
    torch.testing.assert_close(draft.forward(ids, draft.new_cache()), trained.forward(ids, trained.new_cache()),
                               rtol=1e-3, atol=1e-3)     # float16 weights file: same draft to that precision


@pytest.mark.parametrize("flag, packed", [([], True), (["--no-pack-gemm"], False)])
def test_the_cli_loads_packed_unless_told_not_to(monkeypatch, flag, packed):
    import decoding.__main__ as cli

    specs = []

    class Loaded:
        def encode(self, text, chat_template=True):
            return [1, 2]

    def fake_load(spec):
        specs.append(spec)
        return Loaded()

    monkeypatch.setattr(cli, "load", fake_load)
    args = cli.build_parser().parse_args(["run", "--prompt", "hi", *flag])
    assert cli._prepare(args)[1] == [1, 2]
    assert [s.pack_gemm for s in specs] == [packed]


def test_the_parallel_drafters_head_is_packed_for_inference_only(monkeypatch):
    """The drafter's γ-position LM-head product takes the packed op at inference (same numbers as the
    plain product), the plain one under autograd; a copy packs its own; `gamma` computes only the
    first positions, equal to the full computation's."""
    from dspark_helpers import varied_llama

    from decoding.drafters.parallel import DrafterShape, ParallelDrafter

    lm = varied_llama(seed=0)                                          # untied head
    model = lm.model.to("cpu", torch.float32)                          # the packed GEMM is the CPU's
    h = model.config.hidden_size
    drafter = ParallelDrafter(DrafterShape(h, model.config.vocab_size, gamma_max=8, rank=4, trunk=16, width=8))
    with torch.no_grad():
        drafter.w2.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    drafter.eval().attach(lm)
    assert drafter.head_pack is not None
    calls = packed_path_calls(monkeypatch)
    hidden, root = torch.randn(2, h), torch.tensor([3, 7])
    with torch.no_grad():
        out = drafter(hidden, root)
        assert calls == [16]
        torch.testing.assert_close(out.base, out.z @ drafter.head.T, rtol=1e-5, atol=1e-5)
        first = drafter(hidden, root, gamma=3)
        assert calls == [16, 6] and first.base.shape[1] == 3
        torch.testing.assert_close(first.base, out.base[:, :3], rtol=1e-5, atol=1e-5)
        twin = copy.deepcopy(drafter)
        assert twin.head_pack is not None and twin.head_pack is not drafter.head_pack
        torch.testing.assert_close(twin(hidden, root).base, out.base, rtol=1e-5, atol=1e-5)
    trained = drafter(hidden, root)                     # autograd on: the plain product
    assert len(calls) == 3 and trained.base.requires_grad
