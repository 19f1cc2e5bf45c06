"""The matmul anatomy benchmark's pieces on a tiny llama: which weights it times, and its table."""
from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from bench.matmul import PACKED, PLAIN, forward_tables, linear_weights, matmul_ms, matmul_times, packed_kernel, \
    plain_kernel, render
from conftest import make_tiny_llama
from decoding import packed_gemm


def test_linear_weights_are_every_projection_and_the_head():
    model = make_tiny_llama()
    weights = linear_weights(model)
    layers = model.config.num_hidden_layers
    assert len(weights) == 7 * layers + 1          # q, k, v, o, gate, up, down per layer + LM head
    assert weights[-1] is model.lm_head.weight


def test_matmul_ms_and_table():
    weights = linear_weights(make_tiny_llama())
    assert matmul_ms(weights, 3, repeats=2) > 0
    text = render([(1, 2.0, 2.5, 4.0, 4.0), (2, 3.0, 2.8, 5.0, 4.5)], Namespace(max_tokens=2, repeats=2),
                  len(weights), 1.0)
    assert "| 2 | 3.0 | 2.8 | 5.0 | 1.25 | 4.5 | 1.12 |" in text and "--max-tokens 2 --repeats 2" in text


@pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")
def test_both_kernels_compute_the_same_products_and_are_timed_per_row_count():
    weights = linear_weights(make_tiny_llama())
    kernels = {PLAIN: [plain_kernel(w) for w in weights], PACKED: [packed_kernel(w) for w in weights]}
    x = torch.randn(5, weights[0].shape[1])
    torch.testing.assert_close(kernels[PACKED][0](x), kernels[PLAIN][0](x), rtol=1e-5, atol=1e-5)
    times = matmul_times(weights, kernels, (1, 5), repeats=2)
    assert sorted(times) == [(PACKED, 1), (PACKED, 5), (PLAIN, 1), (PLAIN, 5)]
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())


@pytest.mark.skipif(not packed_gemm.available(), reason="this torch has no MKL packed GEMM")
def test_forward_tables_leave_the_model_packed():
    from decoding.models import LM

    lm = LM(make_tiny_llama().to("cpu", torch.float32), tokenizer=None, name="tiny")   # the CPU's GEMM
    tables = forward_tables(lm, 3, repeats=1, rounds=1)
    assert {k: len(v) for k, v in tables.items()} == {PLAIN: 3, PACKED: 3}
    assert packed_gemm.packed_count(lm.model) > 0
