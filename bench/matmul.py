"""Where a multi-token forward's cost comes from: the target's own weight matmuls alone (every
nn.Linear of the model, LM head included, in order, so the weights stream from memory as in a
forward) on n rows, next to the whole forward over n new tokens after a cached prefix, n = 1..N.
Both are medians of repeated runs in one process.

    python -m bench matmul [--max-tokens N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from bench.report import machine, write_section
from decoding.cost import profile_verify_cost
from decoding.models import ModelSpec, load


def linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """Every nn.Linear weight of `model` in module order (the LM head last for a causal LM)."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


@torch.inference_mode()
def matmul_ms(weights: list[torch.Tensor], rows: int, repeats: int) -> float:
    """Median ms of F.linear over every weight for an input of `rows` rows."""
    return statistics.median(matmul_times(weights, (rows,), repeats)[rows])


@torch.inference_mode()
def matmul_times(weights: list[torch.Tensor], row_counts, repeats: int) -> dict[int, list[float]]:
    """ms of F.linear over every weight, per row count; row counts interleaved within each repeat so
    that a slow spell of the machine falls on all of them."""
    inputs = {(n, w.shape[1]): torch.randn(n, w.shape[1], dtype=w.dtype, device=w.device)
              for n in row_counts for w in weights}
    times: dict[int, list[float]] = {n: [] for n in row_counts}
    for rep in range(repeats + 1):                      # repeat 0 warms up and is not kept
        for n in row_counts:
            start = time.perf_counter()
            for w in weights:
                nn.functional.linear(inputs[(n, w.shape[1])], w)
            if rep:
                times[n].append((time.perf_counter() - start) * 1000.0)
    return times


def render(rows: list[tuple[int, float, float]], args, n_weights: int, mib: float) -> str:
    one_mm, one_fw = rows[0][1], rows[0][2]
    lines = ["## Anatomy of a multi-token forward: weight matmuls vs the whole forward", "",
             f"Command: `python -m bench matmul --max-tokens {args.max_tokens} --repeats {args.repeats}`  ",
             f"Model: SmolLM2-135M-Instruct (embedded), fp32; {n_weights} weight matrices ({mib:.0f} MiB); "
             f"machine: {machine()}.  ",
             "matmuls: F.linear over every weight of the model in order on n rows (nothing else); forward: "
             "the model over n new tokens after a 32-token cached prefix (decoding.cost's profile). Medians of "
             "the repeats (matmuls: row counts interleaved in each repeat); × = relative to n = 1. Where the two columns step up together, the cost of "
             "verifying more tokens is the GEMM's, not attention's or the mask's.", "",
             "| n tokens | matmuls ms | × | forward ms | × |", "|---|---|---|---|---|"]
    for n, mm, fw in rows:
        lines.append(f"| {n} | {mm:.1f} | {mm / one_mm:.2f} | {fw:.1f} | {fw / one_fw:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench matmul")
    parser.add_argument("--max-tokens", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    lm = load(ModelSpec())
    weights = linear_weights(lm.model)
    forward = profile_verify_cost(lm, args.max_tokens, repeats=args.repeats).verify_ms
    counts = range(1, args.max_tokens + 1)
    times = matmul_times(weights, counts, args.repeats)
    rows = [(n, statistics.median(times[n]), forward[n - 1]) for n in counts]
    mib = sum(w.numel() * w.element_size() for w in weights) / 2**20
    body = render(rows, args, len(weights), mib)
    write_section("matmul", body)
    print(body)


if __name__ == "__main__":
    main()
