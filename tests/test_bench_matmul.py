"""The matmul anatomy benchmark's pieces on a tiny llama: which weights it times, and its table."""
from __future__ import annotations

from argparse import Namespace

from bench.matmul import linear_weights, matmul_ms, render
from conftest import make_tiny_llama


def test_linear_weights_are_every_projection_and_the_head():
    model = make_tiny_llama()
    weights = linear_weights(model)
    layers = model.config.num_hidden_layers
    assert len(weights) == 7 * layers + 1          # q, k, v, o, gate, up, down per layer + LM head
    assert weights[-1] is model.lm_head.weight


def test_matmul_ms_and_table():
    weights = linear_weights(make_tiny_llama())
    assert matmul_ms(weights, 3, repeats=2) > 0
    text = render([(1, 2.0, 4.0), (2, 3.0, 5.0)], Namespace(max_tokens=2, repeats=2), len(weights), 1.0)
    assert "| 2 | 3.0 | 1.50 | 5.0 | 1.25 |" in text and "--max-tokens 2 --repeats 2" in text
