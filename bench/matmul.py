"""Where a multi-token forward's cost comes from, under both CPU GEMMs: the target's own weight matmuls
alone (every nn.Linear of the model, LM head included, in order, so the weights stream from memory as
in a forward) on n rows, next to the whole forward over n new tokens after a cached prefix, n = 1..N;
once with MKL's plain sgemm (F.linear) and once with its packed weights (decoding/packed_gemm.py, the
default on the CPU). All medians of repeated runs in one process, the two GEMMs interleaved.

    python -m bench matmul [--max-tokens N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from bench.report import machine, write_section
from decoding import packed_gemm
from decoding.cost import profile_verify_cost
from decoding.models import ModelSpec, load

PLAIN, PACKED = "plain", "packed"


def linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every nn.Linear weight of `model` in module order (the LM head last for a causal LM)."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


def plain_kernel(weight: torch.Tensor):
    return lambda x: nn.functional.linear(x, weight)


def packed_kernel(weight: torch.Tensor):
    """MKL's packed sgemm on `weight` for any row count (what PackedLinear does from 4 rows on)."""
    pack = packed_gemm.pack_weight(weight)
    return lambda x: packed_gemm.packed_linear(x, pack, weight)


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
    """Median forward ms per token count, plain and packed, alternating the two `rounds` times."""
    runs: dict[str, list[tuple[float, ...]]] = {PLAIN: [], PACKED: []}
    for _ in range(rounds):
        packed_gemm.unpack_linears(lm.model)
        runs[PLAIN].append(profile_verify_cost(lm, max_tokens, repeats=repeats).verify_ms)
        packed_gemm.pack_linears(lm.model)
        runs[PACKED].append(profile_verify_cost(lm, max_tokens, repeats=repeats).verify_ms)
    return {k: [statistics.median(col) for col in zip(*v)] for k, v in runs.items()}


def render(rows: list[tuple[int, float, float, float, float]], args, n_weights: int, mib: float) -> str:
    """rows: (n, plain matmuls, packed matmuls, plain forward, packed forward)."""
    lines = ["## Anatomy of a multi-token forward: weight matmuls vs the whole forward, plain and packed GEMM", "",
             f"Command: `python -m bench matmul --max-tokens {args.max_tokens} --repeats {args.repeats}`  ",
             f"Model: SmolLM2-135M-Instruct (embedded), fp32; {n_weights} weight matrices ({mib:.0f} MiB); "
             f"machine: {machine()}.  ",
             "matmuls: every weight of the model in order on n rows (nothing else); forward: the model over n "
             "new tokens after a 32-token cached prefix (decoding.cost's profile). plain: MKL's sgemm "
             "(F.linear); packed: MKL's packed weights (decoding/packed_gemm.py; a loaded model uses them "
             f"from {packed_gemm.PACK_MIN_ROWS} tokens on, the plain sgemm below, so its forward column "
             f"equals plain's below {packed_gemm.PACK_MIN_ROWS}). Medians of the repeats (kernels and row "
             "counts interleaved; forwards: three alternating rounds); × = relative to the plain forward "
             "over 1 token. Where matmuls and forward step up together, the cost of verifying more tokens "
             "is the GEMM's, not attention's or the mask's.", "",
             "| n tokens | matmuls plain ms | matmuls packed ms | forward plain ms | × | forward packed ms | × |",
             "|---|---|---|---|---|---|---|"]
    one = rows[0][3]
    for n, mm, mm_packed, fw, fw_packed in rows:
        lines.append(f"| {n} | {mm:.1f} | {mm_packed:.1f} | {fw:.1f} | {fw / one:.2f} | {fw_packed:.1f} | "
                     f"{fw_packed / one:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench matmul")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    if not packed_gemm.available():
        raise SystemExit("bench matmul: this torch has no MKL packed GEMM (x86 builds with MKL only)")
    lm = load(ModelSpec(pack_gemm=False))
    weights = linear_weights(lm.model)
    counts = range(1, args.max_tokens + 1)
    kernels = {PLAIN: [plain_kernel(w) for w in weights], PACKED: [packed_kernel(w) for w in weights]}
    times = matmul_times(weights, kernels, counts, args.repeats)
    del kernels
    forward = forward_tables(lm, args.max_tokens, args.repeats)
    rows = [(n, statistics.median(times[PLAIN, n]), statistics.median(times[PACKED, n]),
             forward[PLAIN][n - 1], forward[PACKED][n - 1]) for n in counts]
    mib = sum(w.numel() * w.element_size() for w in weights) / 2**20
    body = render(rows, args, len(weights), mib)
    write_section("matmul", body)
    print(body)


if __name__ == "__main__":
    main()
