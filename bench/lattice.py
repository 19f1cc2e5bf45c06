"""What one DSpark round's drafting costs: `build_lattice` (drafter pass, head products, top-K per position)
for a plain drafter and a `parent_mlp` one of the shipped drafter's shape (random weights: the cost does
not depend on them) on the embedded model, per (γ, K); medians of repeated calls, the two interleaved,
beside one target forward over γ + 1 tokens, the verification a chain of γ costs.

    python -m bench lattice [--repeats R] [--cases 4x2,8x2,8x4,16x2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.report import machine, write_section
from decoding.drafters.parallel import DrafterShape, ParallelDrafter, build_lattice
from decoding.runtime.cost_table import profile_verify_cost

SHIPPED = {"gamma_max": 16, "feature_layers": (7, 15, 23)}
SLICE = 9274          # the shipped drafter's vocabulary slice


def drafters(lm, shape_args: dict, vocab: int) -> dict:
    """{"plain": ..., "parent_mlp": ...}: random drafters of one shape, attached to `lm`."""
    hidden = lm.model.config.hidden_size
    ids = range(min(vocab, lm.vocab_size))
    return {name: ParallelDrafter(DrafterShape(hidden, lm.vocab_size, parent_mlp=flag, **shape_args),
                                  vocab_ids=ids, seed=0).eval().attach(lm)
            for name, flag in (("plain", False), ("parent_mlp", True))}


def lattice_ms(drafter: ParallelDrafter, gamma: int, k: int, repeats: int, seed: int = 0) -> list[float]:
    """ms of `repeats` build_lattice calls on one random input row (after two warm-up calls)."""
    row = torch.randn(1, drafter.shape.row_width, generator=torch.Generator().manual_seed(seed))
    for _ in range(2):
        build_lattice(drafter, row, 5, gamma, k)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_lattice(drafter, row, 5, gamma, k)
        times.append(1000 * (time.perf_counter() - start))
    return times


def measure(lm, cases, repeats: int, shape_args: dict = SHIPPED, vocab: int = SLICE) -> list[dict]:
    """One row per (γ, K): median ms of each drafter (interleaved in rounds of 5 calls) and the forward
    (decoding.runtime.cost_table's verify-cost profile, the table the cost-aware selection reads)."""
    pair = drafters(lm, shape_args, vocab)
    verify_ms = profile_verify_cost(lm, max(g for g, _ in cases) + 1, repeats=max(3, repeats // 5)).verify_ms
    rows = []
    for gamma, k in cases:
        runs = {name: [] for name in pair}
        for r in range(max(1, repeats // 5)):
            for name in (list(pair) if r % 2 == 0 else list(pair)[::-1]):
                runs[name] += lattice_ms(pair[name], gamma, k, 5, seed=r)
        rows.append({"gamma": gamma, "k": k, **{n: statistics.median(t) for n, t in runs.items()},
                     "forward": verify_ms[gamma]})                  # γ + 1 tokens
    return rows


def render(rows: list[dict], args) -> str:
    lines = ["## DSpark drafting cost: plain vs parent-conditioned per-position block", "",
             f"Command: `python -m bench lattice --repeats {args.repeats} --cases {args.cases}`  ",
             "Model: SmolLM2-135M-Instruct (embedded), fp32. Drafters: the shipped shape (feature layers 7, 15, 23, "
             f"γ_max 16, vocabulary slice {SLICE}), random weights. `build_lattice` from one anchor, median ms; "
             "`forward γ+1`: one target forward over γ + 1 new tokens after a 32-token prefix "
             "(decoding.runtime.cost_table's profile), the verification "
             f"a chain of γ costs. Machine: {machine()}.", "",
             "| γ | K | plain ms | parent_mlp ms | × | forward γ+1 ms |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['gamma']} | {r['k']} | {r['plain']:.1f} | {r['parent_mlp']:.1f} | "
                     f"{r['parent_mlp'] / r['plain']:.2f} | {r['forward']:.1f} |")
    return "\n".join(lines) + "\n"


def parse_cases(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in part.split("x")) for part in text.split(",")]


def main(argv=None) -> None:
    from decoding.runtime.models import ModelSpec, load

    p = argparse.ArgumentParser(prog="python -m bench lattice")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--cases", default="4x2,8x2,8x4,16x2", help="γxK pairs, comma-separated")
    args = p.parse_args(argv)
    rows = measure(load(ModelSpec()), parse_cases(args.cases), args.repeats)
    body = render(rows, args)
    print(body)
    write_section("lattice", body)
