"""Tiny CPU models and linears for the MKL packed GEMM tests."""
from __future__ import annotations

import torch
from conftest import make_tiny_llama
from torch import nn

from decoding.runtime.packed_gemm import PackedLinear, pack_linears


def cpu_llama(**kwargs):
    """A tiny llama on the CPU in float32 whatever the test device: the packed GEMM is the CPU's."""
    return make_tiny_llama(**kwargs).to("cpu", torch.float32)


def linear(in_features=48, out_features=40, bias=True, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


def packed_copy(module: nn.Linear) -> nn.Linear:
    twin = linear(module.in_features, module.out_features, module.bias is not None)
    twin.load_state_dict(module.state_dict())
    assert pack_linears(twin) == 1 and type(twin) is PackedLinear
    return twin
