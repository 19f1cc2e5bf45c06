"""MKL packed GEMM for the CPU linears of a loaded model: the weight is reordered once into MKL's packed
layout (`cblas_sgemm_pack`) and reused by every forward over `PACK_MIN_ROWS` or more rows. On the
embedded model and a 2-core CPU this makes a forward over 4-15 tokens (a verification) 10-25 % faster,
while a 1-token forward keeps the plain path (`python -m bench matmul` measures both; BENCHMARKS.md).

Only fp32 weights on the CPU in a torch built with MKL are packed; anything else keeps nn.Linear's
forward. A packed module falls back to the plain path when autograd is recording (the packed op has no
backward) and when its weight changed after packing (in place, e.g. `load_state_dict`, or replaced, e.g.
`.to()`), so a pack can never be stale. The pack is a second copy of the weights in memory.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

PACK_MIN_ROWS = 4     # below this MKL's plain sgemm is as fast or faster on the machines measured


@functools.cache
def available() -> bool:
    """Whether this torch has MKL's packed sgemm ops (x86 builds with MKL)."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        weight = torch.ones(2, 3)
        pack = torch.ops.mkl._mkl_reorder_linear_weight(weight, 1)
        out = torch.ops.mkl._mkl_linear(torch.ones(1, 3), pack, weight, None, 1)
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((1, 2), 3.0)))


class PackedLinear(nn.Linear):
    """nn.Linear whose forward over many rows uses MKL's packed weight. Made by `pack_linears` (which
    swaps the class of an existing module); state dict and parameters are nn.Linear's own."""

    _pack: torch.Tensor
    _packed_from: tuple[int, int]      # (weight data pointer, weight version) when packed

    def repack(self) -> None:
        self._pack = pack_weight(self.weight.detach())
        self._packed_from = (self.weight.data_ptr(), self.weight._version)

    def __getstate__(self) -> dict:
        """Copies and pickles carry the weight, not the pack (an opaque MKL buffer); they repack."""
        state = dict(super().__getstate__())
        state.pop("_pack", None)
        state.pop("_packed_from", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.repack()

    def pack_is_current(self) -> bool:
        return self._packed_from == (self.weight.data_ptr(), self.weight._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < PACK_MIN_ROWS * self.in_features:      # first: a 1-token step pays one test only
            return nn.functional.linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias, self._pack if self.pack_is_current() else None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, pack: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through `pack` (= pack_weight(weight), None: none) where it serves:
    PACK_MIN_ROWS or more rows of float32 CPU input outside autograd; x (..., in) -> (..., out)."""
    in_features = weight.shape[1]
    if (pack is None or x.numel() < PACK_MIN_ROWS * in_features or torch.is_grad_enabled()
            or x.dtype != torch.float32 or x.device.type != "cpu"):
        return nn.functional.linear(x, weight, bias)
    out = packed_linear(x.reshape(-1, in_features), pack, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def pack_or_none(weight: torch.Tensor) -> torch.Tensor | None:
    """pack_weight(weight) for a float32 CPU weight when this torch has the packed GEMM, else None."""
    return pack_weight(weight) if _cpu_fp32(weight) and available() else None


def _cpu_fp32(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """MKL's packed copy of a (out, in) fp32 CPU weight; one pack serves every row count."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_MIN_ROWS)


def packed_linear(x: torch.Tensor, pack: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """x (rows, in) @ weightᵀ (+ bias) -> (rows, out) with `pack` = pack_weight(weight)."""
    return torch.ops.mkl._mkl_linear(x, pack, weight, bias, x.shape[0])


def _needs_pack(module: nn.Module) -> bool:
    """An fp32 CPU nn.Linear not packed yet, or a PackedLinear whose weight changed since packing."""
    if type(module) not in (nn.Linear, PackedLinear):
        return False
    weight = module.weight
    if not _cpu_fp32(weight) or weight.is_inference():        # an inference tensor has no version counter
        return False
    return type(module) is nn.Linear or not module.pack_is_current()


def pack_linears(model: nn.Module) -> int:
    """Pack every fp32 CPU nn.Linear of `model` in place, and pack again those whose weight changed since
    (e.g. trained weights loaded into a copy); returns how many were packed (0 when this torch has no MKL
    packed GEMM). A module shared by two models (a draft built on the target's layers) is packed once."""
    if not available():
        return 0
    count = 0
    for module in model.modules():
        if _needs_pack(module):
            module.__class__ = PackedLinear
            module.repack()
            count += 1
    return count


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: plain nn.Linear again, the packs freed; returns how many were unpacked."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            del module._pack, module._packed_from
            count += 1
    return count


def packed_count(model: nn.Module) -> int:
    return sum(type(m) is PackedLinear for m in model.modules())
