"""The matmul anatomy benchmark's pieces on a tiny llama: which weights it times, and its table."""
from __future__ import annotations

from argparse import Namespace

import pytest
import torch
from conftest import make_tiny_llama

from bench.matmul import KERNEL_MAKERS, PLAIN, forward_tables, linear_weights, matmul_ms, matmul_times, render
from decoding.runtime import packed_gemm


def test_linear_weights_are_every_projection_and_the_head():
    model = make_tiny_llama()
    weights = linear_weights(model)
    layers = model.config.num_hidden_layers
    assert len(weights) == 7 * layers + 1          # q, k, v, o, gate, up, down per layer + LM head
    assert weights[-1] is model.lm_head.weight


def test_matmul_ms_and_table():
    weights = linear_weights(make_tiny_llama())
    assert matmul_ms(weights, 3, repeats=2) > 0
    plan = packed_gemm.GemmPlan((1, 2), (PLAIN, "onednn"))
    text = render([1, 2], {PLAIN: [2.0, 3.0], "onednn": [1.5, 2.0]}, {PLAIN: [4.0, 5.0], "onednn": [3.0, 4.5]},
                  plan, Namespace(max_tokens=2, repeats=2), len(weights), 1.0)
    assert "| n tokens | matmuls plain ms | matmuls onednn ms | forward plain ms | × | forward onednn ms | × |" \
        " auto plan |" in text
    assert "| 2 | 3.0 | 2.0 | 5.0 | 1.25 | 4.5 | 1.12 | onednn |" in text and "| 1 | 2.0 | 1.5 | 4.0 | 1.00 |" in text
    assert "--max-tokens 2 --repeats 2" in text and "1plain-2onednn" in text


@pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")
def test_every_kernel_computes_the_same_products_and_is_timed_per_row_count():
    weights = linear_weights(make_tiny_llama())
    here = packed_gemm.kernels_here()
    kernels = {k: [KERNEL_MAKERS[k](w) for w in weights] for k in here}
    x = torch.randn(5, weights[0].shape[1])
    for k in here:
        torch.testing.assert_close(kernels[k][0](x), kernels[PLAIN][0](x), rtol=1e-5, atol=1e-5)
    times = matmul_times(weights, kernels, (1, 5), repeats=2)
    assert sorted(times) == sorted((k, n) for k in here for n in (1, 5))
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())


@pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")
def test_forward_tables_leave_the_model_packed_on_its_plan():
    from decoding.runtime.models import LM

    model = make_tiny_llama().to("cpu", torch.float32)                                    # the CPU's GEMM
    packed_gemm.pack_linears(model, packed_gemm.GemmPlan((1,), (PLAIN,)))
    lm = LM(model, tokenizer=None, name="tiny")
    tables = forward_tables(lm, 3, repeats=1, rounds=1)
    assert {k: len(v) for k, v in tables.items()} == dict.fromkeys(packed_gemm.kernels_here(), 3)
    assert packed_gemm.packed_count(lm.model) > 0 and packed_gemm.model_plan(lm.model).tag == "1plain"
