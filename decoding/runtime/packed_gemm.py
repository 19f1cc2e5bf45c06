"""CPU GEMM kernels for the linears of a loaded model. Three compute the same F.linear in float32, each
with its own summation order (differences ~1e-5): `plain` (MKL's sgemm), `packed` (the weight reordered
once into MKL's packed layout for PACK_ROWS_HINT rows, `cblas_sgemm_pack`, and reused by every forward)
and `onednn` (oneDNN's matmul, torch.ops.mkldnn._linear_pointwise). Which is fastest depends on the CPU
and on the number of rows: on a 2-core Intel Xeon plain was best for 1-3 rows and packed from 4 (a
forward over 9 tokens 53 ms against 60 on plain sgemm and 62 on oneDNN);
on a 2-core AMD EPYC MKL's kernels are slow and oneDNN's took 52 ms for a 1-token forward of the embedded
model against 68, 65 against 92 for 6 tokens (`python -m bench matmul`; BENCHMARKS.md).

A `GemmPlan` says which kernel serves a forward over n rows. `DEFAULT_PLAN` is plain below
`PACK_MIN_ROWS` rows and packed from there; `auto_plan` times every kernel on the model's own weights at
a few row counts once per machine, model and thread count (a few seconds, on first load) and caches the
plan, so later loads on that machine compute the same numbers.

Only fp32 weights on the CPU in a torch built with MKL are packed; anything else keeps nn.Linear's
forward. A packed module falls back to the plain path when autograd is recording (the packed op has no
backward) and when its weight changed after packing (in place, e.g. `load_state_dict`, or replaced, e.g.
`.to()`), so a pack can never be stale. The pack is a second copy of the weights in memory.
"""
from __future__ import annotations

import bisect
import functools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from decoding.runtime import load_progress
from decoding.runtime.files import save_to_cache, write_text_atomic

PACK_MIN_ROWS = 4     # below this MKL's plain sgemm is as fast or faster on the machines measured
PACK_ROWS_HINT = 32   # the row count MKL lays the pack out for; it serves any count, fastest up to about this


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


KERNELS = ("plain", "packed", "onednn")
PROFILE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
AUTO_MIN_MIB = 32.0   # a model with fewer MiB of linear weights keeps DEFAULT_PLAN (too small to matter)


@dataclass(frozen=True)
class GemmPlan:
    """A forward over n rows uses kernels[i] for the largest rows[i] <= n (rows ascending from 1)."""
    rows: tuple[int, ...]
    kernels: tuple[str, ...]
    source: str = "default"                     # "default", or the cache file an auto plan came from

    def __post_init__(self):
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not (self.rows and self.rows[0] == 1 and list(self.rows) == sorted(set(self.rows))):
            raise ValueError(f"plan rows {self.rows} must ascend from 1")
        if not (len(self.kernels) == len(self.rows) and set(self.kernels) <= set(KERNELS)):
            raise ValueError(f"plan kernels {self.kernels} must be one of {KERNELS} per row count")

    def kernel(self, rows: int) -> str:
        return self.kernels[max(bisect.bisect_right(self.rows, rows) - 1, 0)]

    @property
    def tag(self) -> str:
        """Short and stable, e.g. "1plain-4packed": the row counts where the kernel changes."""
        parts, last = [], None
        for r, k in zip(self.rows, self.kernels):
            if k != last:
                parts.append(f"{r}{k}")
                last = k
        return "-".join(parts)


DEFAULT_PLAN = GemmPlan((1, PACK_MIN_ROWS), ("plain", "packed"))


@functools.cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's float32 linear on the CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        out = onednn_linear(torch.ones(1, 3), torch.ones(2, 3), None)
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((1, 2), 3.0)))


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def kernels_here() -> tuple[str, ...]:
    return ("plain",) + (("packed",) if available() else ()) + (("onednn",) if onednn_available() else ())


class PackedLinear(nn.Linear):
    """nn.Linear whose forward runs the kernel its `plan` names for the row count (MKL's packed weight
    among them). Made by `pack_linears` (which swaps the class of an existing module); state dict and
    parameters are nn.Linear's own."""

    _pack: torch.Tensor | None         # None: freed, the plan has no packed kernel
    _packed_from: tuple[int, int]      # (weight data pointer, weight version) when packed
    plan: GemmPlan = DEFAULT_PLAN      # set per module by pack_linears / use_plan

    def __getstate__(self) -> dict:
        """Copies and pickles carry the weight, not the pack (an opaque MKL buffer); they repack."""
        state = dict(super().__getstate__())
        state.pop("_pack", None)
        state.pop("_packed_from", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.repack()

    def repack(self) -> None:
        """Pack the current weight, or, when the plan has no packed kernel, only note it as current."""
        self._pack = pack_weight(self.weight.detach()) if "packed" in self.plan.kernels else None
        self._packed_from = (self.weight.data_ptr(), self.weight._version)

    def pack_is_current(self) -> bool:
        return self._packed_from == (self.weight.data_ptr(), self.weight._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self._pack if self.pack_is_current() else None, self.plan)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, pack: torch.Tensor | None = None,
           plan: GemmPlan = DEFAULT_PLAN) -> torch.Tensor:
    """F.linear(x, weight, bias) through the kernel `plan` names for x's row count, where it serves:
    float32 CPU input outside autograd, and for `packed` a `pack` (= pack_weight(weight); None: none).
    Anything else takes the plain F.linear. x (..., in) -> (..., out)."""
    in_features = weight.shape[1]
    kernel = plan.kernel(x.numel() // in_features)
    if (kernel == "plain" or torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu"
            or (kernel == "packed" and pack is None)):
        return nn.functional.linear(x, weight, bias)
    if kernel == "onednn":
        return onednn_linear(x, weight, bias)
    out = packed_linear(x.reshape(-1, in_features), pack, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def pack_or_none(weight: torch.Tensor) -> torch.Tensor | None:
    """pack_weight(weight) for a float32 CPU weight when this torch has the packed GEMM, else None."""
    return pack_weight(weight) if _cpu_fp32(weight) and available() else None


def _cpu_fp32(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32


def pack_weight(weight: torch.Tensor, rows_hint: int = PACK_ROWS_HINT) -> torch.Tensor:
    """MKL's packed copy of a (out, in) fp32 CPU weight, laid out for `rows_hint` rows; one pack serves
    every row count."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows_hint)


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


def pack_linears(model: nn.Module, plan: GemmPlan | None = None) -> int:
    """Pack every fp32 CPU nn.Linear of `model` in place, and pack again those whose weight changed since
    (e.g. trained weights loaded into a copy); returns how many were packed (0 when this torch has no MKL
    packed GEMM). A module shared by two models (a draft built on the target's layers) is packed once.
    `plan` (None: a new module gets DEFAULT_PLAN, one packed before keeps its own) is then every packed
    module's."""
    if not available():
        return 0
    count = 0
    for module in model.modules():
        if _needs_pack(module):
            module.__class__ = PackedLinear
            module.repack()
            count += 1
    if plan is not None:
        use_plan(model, plan)
    return count


def use_plan(model: nn.Module, plan: GemmPlan) -> None:
    """Make `plan` every packed linear's; a plan without the packed kernel frees the packs (the second
    copy of the weights), one with it packs again where a pack was freed."""
    for module in model.modules():
        if type(module) is PackedLinear:
            module.plan = plan
            if "packed" not in plan.kernels:
                module._pack = None
            elif module._pack is None:
                module.repack()


def model_plan(model: nn.Module) -> GemmPlan | None:
    """The plan of the model's packed linears (None: none packed)."""
    return next((m.plan for m in model.modules() if type(m) is PackedLinear), None)


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears`: plain nn.Linear again, the packs freed; returns how many were unpacked."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            del module._pack, module._packed_from
            module.__dict__.pop("plan", None)
            count += 1
    return count


def packed_count(model: nn.Module) -> int:
    return sum(type(m) is PackedLinear for m in model.modules())


# ---------------------------------------------------------------- the auto plan

def _run_kernel(kernel: str, module: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    if kernel == "plain":
        return nn.functional.linear(x, module.weight, module.bias)
    if kernel == "onednn":
        return onednn_linear(x, module.weight, module.bias)
    return packed_linear(x, module._pack, module.weight, module.bias)


@torch.inference_mode()
def profile_plan(model: nn.Module, rows=PROFILE_ROWS, rounds: int = 3) -> tuple[GemmPlan, dict]:
    """Time each kernel here over every packed linear of `model` in order (its own weights, n random
    rows) for each n in `rows`; `rounds` rounds, kernels in alternating order; per n the kernel with the
    lowest median wins. -> (plan, {kernel: [median ms per n]})."""
    modules = [m for m in model.modules() if type(m) is PackedLinear]
    for m in modules:
        if m._pack is None:                                   # freed by a plan without it: time it too
            m._pack = pack_weight(m.weight.detach())
    kernels = kernels_here()
    inputs = {n: {m.in_features: torch.randn(n, m.in_features) for m in modules} for n in rows}
    times = {k: {n: [] for n in rows} for k in kernels}
    for k in kernels:                                         # warm-up: first calls allocate
        for m in modules:
            _run_kernel(k, m, inputs[rows[0]][m.in_features])
    for r in range(rounds):
        for n in rows:
            for k in (kernels if r % 2 == 0 else kernels[::-1]):
                start = time.perf_counter()
                for m in modules:
                    _run_kernel(k, m, inputs[n][m.in_features])
                times[k][n].append((time.perf_counter() - start) * 1000.0)
    medians = {k: [statistics.median(times[k][n]) for n in rows] for k in kernels}
    best = tuple(min(kernels, key=lambda k: medians[k][i]) for i in range(len(rows)))
    return GemmPlan(tuple(rows), best, source="profiled"), medians


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's word for it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{platform.machine()} {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def linear_mib(model: nn.Module) -> float:
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if type(m) is PackedLinear) / 2 ** 20


def auto_plan(model: nn.Module, path: Path) -> GemmPlan:
    """The cached plan at `path`, else profile_plan's, cached there. DEFAULT_PLAN for a model without
    packed linears or with under AUTO_MIN_MIB of them (nothing to gain, and tests stay deterministic)."""
    if not any(type(m) is PackedLinear for m in model.modules()) or linear_mib(model) < AUTO_MIN_MIB:
        return DEFAULT_PLAN
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return GemmPlan(tuple(data["rows"]), tuple(data["kernels"]), source=str(path))
        except (OSError, ValueError, KeyError, TypeError):
            pass                                              # unreadable: profile again
    load_progress.report("tune")
    plan, medians = profile_plan(model)
    text = json.dumps({"rows": list(plan.rows), "kernels": list(plan.kernels), "ms": medians}, indent=1)
    save_to_cache(lambda p: write_text_atomic(p, text), path)
    return GemmPlan(plan.rows, plan.kernels, source=str(path))
