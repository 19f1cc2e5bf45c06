"""Where a multi-token forward's cost comes from, under each CPU GEMM kernel here (decoding/runtime/packed_gemm.py:
MKL's plain sgemm, MKL's packed weights, oneDNN's matmul): the target's own weight matmuls alone (every
nn.Linear of the model, LM head included, in order, so the weights stream from memory as in a forward) on
n rows, next to the whole forward over n new tokens after a cached prefix, n = 1..N, with every linear on
that kernel; and the kernel the loaded model's auto plan picked for each n. All medians of repeated runs in
one process, the kernels interleaved.

    python -m bench matmul [--max-tokens N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from bench.report import machine, write_section
from decoding.runtime import packed_gemm
from decoding.runtime.cost_table import profile_verify_cost
from decoding.runtime.models import ModelSpec, load

PLAIN, PACKED, ONEDNN = packed_gemm.KERNELS


def linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every nn.Linear weight of `model` in module order (the LM head last for a causal LM)."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


def plain_kernel(weight: torch.Tensor):
    return lambda x: nn.functional.linear(x, weight)


def packed_kernel(weight: torch.Tensor, rows_hint: int = packed_gemm.PACK_ROWS_HINT):
    """MKL's packed sgemm on `weight` for any row count, the pack laid out for `rows_hint` rows."""
    pack = packed_gemm.pack_weight(weight, rows_hint)
    return lambda x: packed_gemm.packed_linear(x, pack, weight)


OLD_PACK_ROWS = 4                   # the row count packs were laid out for before PACK_ROWS_HINT
OLD_PACK = f"packed for {OLD_PACK_ROWS} rows"   # matmuls only, beside the current layout


def onednn_kernel(weight: torch.Tensor):
    return lambda x: packed_gemm.onednn_linear(x, weight)


KERNEL_MAKERS = {PLAIN: plain_kernel, PACKED: packed_kernel, ONEDNN: onednn_kernel}


@torch.inference_mode()
def matmul_ms(weights: list[torch.Tensor], rows: int, repeats: int) -> float:
    """Median ms of F.linear over every weight for an input of `rows` rows."""
    kernels = {PLAIN: [plain_kernel(w) for w in weights]}
    return statistics.median(matmul_times(weights, kernels, (rows,), repeats)[PLAIN, rows])


@torch.inference_mode()
def matmul_times(weights, kernels: dict[str, list], row_counts, repeats: int) -> dict[tuple[str, int], list[float]]:
    """ms of each kernel set over every weight, per row count; kernels and row counts interleaved within
    each repeat so that a slow spell of the machine falls on all of them."""
    inputs = {(n, w.shape[1]): torch.randn(n, w.shape[1], dtype=w.dtype, device=w.device)
              for n in row_counts for w in weights}
    times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in kernels for n in row_counts}
    for rep in range(repeats + 1):                      # repeat 0 warms up and is not kept
        for n in row_counts:
            for kind, fns in kernels.items():
                start = time.perf_counter()
                for w, fn in zip(weights, fns):
                    fn(inputs[(n, w.shape[1])])
                if rep:
                    times[kind, n].append((time.perf_counter() - start) * 1000.0)
    return times


def forward_tables(lm, max_tokens: int, repeats: int, rounds: int = 3) -> dict[str, list[float]]:
    """Median forward ms per token count with every linear on one kernel, for each kernel here, the
    kernels alternating `rounds` times; the model keeps its own plan afterwards."""
    packed_gemm.pack_linears(lm.model)
    own = packed_gemm.model_plan(lm.model)
    kernels = packed_gemm.kernels_here()
    runs: dict[str, list[tuple[float, ...]]] = {k: [] for k in kernels}
    try:
        for r in range(rounds):
            for kernel in (kernels if r % 2 == 0 else kernels[::-1]):
                packed_gemm.use_plan(lm.model, packed_gemm.GemmPlan((1,), (kernel,)))
                runs[kernel].append(profile_verify_cost(lm, max_tokens, repeats=repeats).verify_ms)
    finally:
        packed_gemm.use_plan(lm.model, own)
    return {k: [statistics.median(col) for col in zip(*v)] for k, v in runs.items()}


def render(counts, matmuls: dict[str, list[float]], forwards: dict[str, list[float]], plan, args,
           n_weights: int, mib: float) -> str:
    """matmuls / forwards: {kernel: ms per row count in `counts`}; plan: the loaded model's auto plan."""
    kernels = list(forwards)
    one = forwards[PLAIN][0]
    head = (["n tokens"] + [f"matmuls {k} ms" for k in matmuls]
            + [c for k in kernels for c in (f"forward {k} ms", "×")] + ["auto plan"])
    lines = ["## Anatomy of a multi-token forward: weight matmuls vs the whole forward, per GEMM kernel", "",
             f"Command: `python -m bench matmul --max-tokens {args.max_tokens} --repeats {args.repeats}`  ",
             f"Model: SmolLM2-135M-Instruct (embedded), fp32; {n_weights} weight matrices ({mib:.0f} MiB); "
             f"machine: {machine()}.  ",
             "matmuls: every weight of the model in order on n rows (nothing else); forward: the model over n "
             "new tokens after a 32-token cached prefix (decoding.runtime.cost_table's profile), every linear on the "
             "kernel. "
             f"plain: MKL's sgemm (F.linear); packed: MKL's packed weights laid out for {packed_gemm.PACK_ROWS_HINT} "
             f"rows ({OLD_PACK}: the layout used before, matmuls only); onednn: oneDNN's matmul "
             "(decoding/runtime/packed_gemm.py). auto plan: the kernel a loaded model uses for n rows on this machine "
             f"(its one-time profile, {plan.tag}). Medians of the repeats (kernels and row counts interleaved; "
             "forwards: three alternating rounds); × = relative to the plain forward over 1 token. Where "
             "matmuls and forward step up together, the cost of verifying more tokens is the GEMM's, not "
             "attention's or the mask's.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, n in enumerate(counts):
        cells = [str(n)] + [f"{matmuls[k][i]:.1f}" for k in matmuls]
        cells += [c for k in kernels for c in (f"{forwards[k][i]:.1f}", f"{forwards[k][i] / one:.2f}")]
        lines.append("| " + " | ".join(cells + [plan.kernel(n)]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench matmul")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    if not packed_gemm.available():
        raise SystemExit("bench matmul: this torch has no MKL packed GEMM (x86 builds with MKL only)")
    lm = load(ModelSpec())
    weights = linear_weights(lm.model)
    counts = list(range(1, args.max_tokens + 1))
    kernels = {k: [KERNEL_MAKERS[k](w) for w in weights] for k in packed_gemm.kernels_here()}
    kernels[OLD_PACK] = [packed_kernel(w, OLD_PACK_ROWS) for w in weights]
    times = matmul_times(weights, kernels, counts, args.repeats)
    matmuls = {k: [statistics.median(times[k, n]) for n in counts] for k in kernels}
    del kernels
    forwards = forward_tables(lm, args.max_tokens, args.repeats)
    mib = sum(w.numel() * w.element_size() for w in weights) / 2**20
    body = render(counts, matmuls, forwards, lm.gemm_plan, args, len(weights), mib)
    write_section("matmul", body)
    print(body)


if __name__ == "__main__":
    main()
