"""CPU GEMM plans (decoding/runtime/packed_gemm.py): each kernel computes nn.Linear's numbers; a packed linear
runs the kernel its plan names for the row count (and the plain one under autograd); a plan without the
packed kernel frees the packs; the auto plan is the fastest kernel per row count of its own profile,
cached and read back; small models keep the default; the embedded model's plan keeps greedy's tokens."""
from __future__ import annotations

import json

import pytest
import torch
from gemm_support import cpu_llama, linear, packed_copy

from decoding.runtime import packed_gemm
from decoding.runtime.cost_table import auto_cost_path
from decoding.runtime.packed_gemm import DEFAULT_PLAN, GemmPlan, PackedLinear, pack_linears, use_plan

pytestmark = pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")
needs_onednn = pytest.mark.skipif(not packed_gemm.onednn_available(), reason="this torch has no oneDNN linear")


def test_plan_maps_row_counts_and_names_itself():
    plan = GemmPlan((1, 2, 4, 8), ("plain", "onednn", "onednn", "packed"))
    assert [plan.kernel(n) for n in (1, 2, 3, 4, 7, 8, 100)] == \
        ["plain", "onednn", "onednn", "onednn", "onednn", "packed", "packed"]
    assert plan.tag == "1plain-2onednn-8packed" and DEFAULT_PLAN.tag == "1plain-4packed"
    for rows, kernels in (((2, 4), ("plain", "packed")), ((1, 1), ("plain", "plain")), ((1,), ("mkl",)),
                          ((1, 2), ("plain",))):
        with pytest.raises(ValueError, match="^plan "):
            GemmPlan(rows, kernels)


@pytest.mark.parametrize("kernel", packed_gemm.KERNELS)
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_every_kernel_computes_nn_linear(kernel, bias):
    if kernel not in packed_gemm.kernels_here():
        pytest.skip(f"this torch has no {kernel} kernel")
    plain = linear(bias=bias)
    packed = packed_copy(plain)
    use_plan(packed, GemmPlan((1,), (kernel,)))
    for shape in [(rows, plain.in_features) for rows in (1, 2, 3, 5, 8, 17)] + [(2, 3, plain.in_features)]:
        x = torch.randn(shape)
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    strided = torch.randn(plain.in_features, 5).T                  # a non-contiguous view
    torch.testing.assert_close(packed(strided), plain(strided), rtol=1e-5, atol=1e-5)


def kernel_calls(monkeypatch) -> list[tuple[str, int]]:
    """(kernel, rows) of every call that reached the packed or the oneDNN op."""
    calls: list[tuple[str, int]] = []
    real_packed, real_dnn = packed_gemm.packed_linear, packed_gemm.onednn_linear

    def packed_spy(x, pack, weight, bias=None):
        calls.append(("packed", x.shape[0]))
        return real_packed(x, pack, weight, bias)

    def dnn_spy(x, weight, bias=None):
        calls.append(("onednn", x.numel() // x.shape[-1]))
        return real_dnn(x, weight, bias)

    monkeypatch.setattr(packed_gemm, "packed_linear", packed_spy)
    monkeypatch.setattr(packed_gemm, "onednn_linear", dnn_spy)
    return calls


@needs_onednn
@torch.no_grad()
def test_a_packed_linear_runs_the_kernel_its_plan_names(monkeypatch):
    module = packed_copy(linear())
    use_plan(module, GemmPlan((1, 3, 6), ("onednn", "plain", "packed")))
    calls = kernel_calls(monkeypatch)
    for rows in (1, 2, 3, 5, 6, 9):
        module(torch.randn(rows, module.in_features))
    assert calls == [("onednn", 1), ("onednn", 2), ("packed", 6), ("packed", 9)]
    calls.clear()
    with torch.enable_grad():                                  # autograd: the plain path, whatever the plan
        module(torch.randn(6, module.in_features, requires_grad=True)).sum().backward()
    assert calls == []


@torch.no_grad()
def test_a_plan_without_the_packed_kernel_frees_the_packs_and_one_with_it_packs_again():
    model = cpu_llama()
    pack_linears(model)
    modules = [m for m in model.modules() if type(m) is PackedLinear]
    x = torch.randint(0, 64, (1, 7))
    want = model(x).logits
    use_plan(model, GemmPlan((1,), ("plain",)))
    assert all(m._pack is None and m.plan.tag == "1plain" for m in modules)
    torch.testing.assert_close(model(x).logits, want, rtol=1e-5, atol=1e-5)
    use_plan(model, DEFAULT_PLAN)
    assert all(m._pack is not None and m.pack_is_current() for m in modules)
    torch.testing.assert_close(model(x).logits, want, rtol=1e-5, atol=1e-5)


def test_auto_plan_is_the_fastest_kernel_per_row_count_cached_and_read_back(tmp_path, monkeypatch):
    model = cpu_llama()
    pack_linears(model)
    path = tmp_path / "gemm" / "plan.json"
    assert packed_gemm.auto_plan(model, path) is DEFAULT_PLAN and not path.exists()   # too small to profile
    monkeypatch.setattr(packed_gemm, "AUTO_MIN_MIB", 0.0)
    plan = packed_gemm.auto_plan(model, path)
    saved = json.loads(path.read_text())
    assert plan.rows == packed_gemm.PROFILE_ROWS and plan.source == str(path)
    assert set(saved["ms"]) == set(packed_gemm.kernels_here())
    for i, kernel in enumerate(plan.kernels):                      # the winner of each row count
        assert saved["ms"][kernel][i] == min(ms[i] for ms in saved["ms"].values())
    profiled = []
    stand_in = GemmPlan((1,), ("plain",), source="profiled")

    def fake_profile(*args, **kwargs):
        profiled.append(1)
        return stand_in, {"plain": [1.0]}

    monkeypatch.setattr(packed_gemm, "profile_plan", fake_profile)
    again = packed_gemm.auto_plan(model, path)                     # read back, not profiled again
    assert (again.rows, again.kernels) == (plan.rows, plan.kernels) and not profiled
    path.write_text("{not json")
    redone = packed_gemm.auto_plan(model, path)                    # unreadable: profiled again, rewritten
    assert profiled == [1] and redone.kernels == ("plain",) and json.loads(path.read_text())["kernels"] == ["plain"]


def test_the_cost_table_of_one_plan_never_prices_another():
    from decoding.runtime.models import LM

    model = cpu_llama()
    pack_linears(model)
    default = auto_cost_path(LM(model, tokenizer=None, name="tiny-plan"))
    use_plan(model, GemmPlan((1,), ("plain",)))
    assert auto_cost_path(LM(model, tokenizer=None, name="tiny-plan")) != default


def test_another_pack_layout_is_profiled_and_timed_anew(monkeypatch):
    """The pack's row hint sets its speed, so neither a cached plan nor a cached cost table made under
    another hint is read back."""
    from decoding.runtime.cost_table import auto_cost_path
    from decoding.runtime.models import LM
    from decoding.runtime.paths import gemm_plan_path

    model = cpu_llama()
    pack_linears(model)
    lm = LM(model, tokenizer=None, name="tiny-plan")
    plan_file, cost_file = gemm_plan_path("tiny-plan"), auto_cost_path(lm)
    monkeypatch.setattr(packed_gemm, "PACK_ROWS_HINT", packed_gemm.PACK_ROWS_HINT * 2)
    assert gemm_plan_path("tiny-plan") != plan_file and auto_cost_path(lm) != cost_file
    use_plan(model, GemmPlan((1,), ("plain",)))                   # no pack: the hint does not matter
    lm = LM(model, tokenizer=None, name="tiny-plan")
    plain_cost = auto_cost_path(lm)
    monkeypatch.setattr(packed_gemm, "PACK_ROWS_HINT", packed_gemm.PACK_ROWS_HINT * 2)
    assert auto_cost_path(lm) == plain_cost


@needs_onednn
@pytest.mark.slow
def test_the_embedded_models_plan_keeps_greedys_tokens(real_lm):
    """The loaded model runs its auto plan; every single-kernel plan gives the same greedy tokens and
    logits within float32 summation-order noise."""
    from decoding import runner
    from decoding.core.config import GreedyConfig

    if real_lm.device.type != "cpu":
        pytest.skip("the GEMM plan is the CPU's; the embedded model is on " + str(real_lm.device))
    plan = real_lm.gemm_plan
    assert plan is not None and set(plan.kernels) <= set(packed_gemm.kernels_here())
    assert plan.source.endswith(".json") and plan.tag in auto_cost_path(real_lm).name
    ids = real_lm.encode("Give two tips for learning to cook.")
    outputs, logits = {}, {}
    try:
        for kernel in packed_gemm.kernels_here():
            use_plan(real_lm.model, GemmPlan((1,), (kernel,)))
            outputs[kernel] = runner.run(real_lm, ids, GreedyConfig(max_new_tokens=24)).output_ids
            with torch.no_grad():
                logits[kernel] = real_lm.model(torch.tensor([ids])).logits[0, -8:]
    finally:
        use_plan(real_lm.model, plan)
    assert len(set(outputs.values())) == 1, outputs
    for kernel in logits:      # float32 rounding of another summation order: relative to the logits' size
        assert float((logits[kernel] - logits["plain"]).abs().max()) <= 2e-5 * float(logits["plain"].abs().max())
