"""Lossy mode (DSpark's `lossy_threshold`): what it buys and what it costs.

    python -m bench lossy [--repeats R] [--max-new-tokens N] [--thresholds 0.5,0.3,0.2]

Cost, exactly: on tabular toy models (decoding/toy.py, vocabulary 3, chain γ = 4, K = 2, fractions),
the total-variation distance between the distribution of the first 5 emitted tokens and the target's
own, and the expected tokens per verification round, for each threshold (threshold ≥ 1 is the exact rule).
Gain, measured: on the embedded model at temperature 0.8 with the shipped drafter, tokens per target
forward and tokens/s relative to the exact rule, interleaved in one process.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from fractions import Fraction

from bench.dspark import parallel_config
from bench.prompts import PROMPTS
from bench.report import machine, spread, write_section
from decoding import runner
from decoding.core.acceptance import exact_branches, lossy_branches, round_distribution, total_variation
from decoding.lab.toy import draft_lattice, random_table, speculative_sequences, target_sequences
from decoding.runtime.models import ModelSpec, load
from decoding.strategies.dspark_select import best_chain, flat_tree

TOY_SEEDS = (1, 2, 3, 4, 5)


def toy_cost(threshold: Fraction | None, length: int = 5) -> tuple[float, float]:
    """(mean TV over the toy seeds, mean expected tokens per round from token 0)."""
    tvs, per_round = [], []
    for seed in TOY_SEEDS:
        rng = random.Random(seed)
        target, draft = random_table(rng, 3), random_table(rng, 3)
        plan = lambda last, draft=draft: flat_tree(last, best_chain(draft_lattice(draft, last, 4, 2)))
        rule = exact_branches if threshold is None else (lambda p, c: lossy_branches(p, c, threshold))
        got = speculative_sequences(target, 0, length, plan, rule)
        tvs.append(float(total_variation(got, target_sequences(target, 0, length))))
        tokens, parents = plan(0)
        one = round_distribution(tokens, parents, lambda i, rows=target.rows, tokens=tokens: rows[tokens[i]], rule)
        per_round.append(float(sum(w * len(e) for e, w in one.items())))
    return statistics.mean(tvs), statistics.mean(per_round)


def real_gain(lm, thresholds, args) -> dict:
    configs = {"exact": parallel_config(max_new_tokens=args.max_new_tokens, temperature=0.8, seed=0)}
    for t in thresholds:
        configs[f"lossy {t}"] = parallel_config(max_new_tokens=args.max_new_tokens, temperature=0.8, seed=0,
                                             lossy_threshold=t)
    rows = {name: {"speed": [], "tau": []} for name in configs}
    encoded = [lm.encode(p) for p in PROMPTS.values()]
    for rep in range(args.repeats):
        for ids in encoded:
            walls = {}
            for name in (configs if rep % 2 == 0 else reversed(list(configs))):
                start = time.perf_counter()
                tr = runner.run(lm, ids, configs[name])
                walls[name] = len(tr.output_ids) / (time.perf_counter() - start)
                rows[name]["tau"].append(tr.stats.mean_accepted_length)
            for name in configs:
                rows[name]["speed"].append(walls[name] / walls["exact"])
    return rows


def render(toy: dict, real: dict, args) -> str:
    lines = ["## DSpark lossy mode: speed gained vs distribution moved", "",
             f"Command: `python -m bench lossy --repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
             f"--thresholds {args.thresholds}`  ",
             f"Machine: {machine()}. Lossy mode accepts a drafted token outright when p_target(x) exceeds the "
             "threshold (off by default; labelled in the trace and the app).", "",
             "Exact cost on toy models (vocabulary 3, chain γ = 4, K = 2, 5 seeds, fractions):", "",
             "| rule | TV distance of the first 5 tokens from the target | expected tokens per round |",
             "|---|---:|---:|"]
    for name, (tv, per_round) in toy.items():
        lines.append(f"| {name} | {tv:.4f} | {per_round:.3f} |")
    lines += ["", "Measured gain on the embedded model (temperature 0.8, seed 0, shipped drafter, chain γ = 8, "
              "bench/prompts.py; median [min–max] over prompts × repeats):", "",
              "| rule | τ (tokens / target forward) | tokens/s vs the exact rule |", "|---|---|---|"]
    for name, r in real.items():
        lines.append(f"| {name} | {spread(r['tau'])} | {spread(r['speed'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench lossy")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--thresholds", default="0.5,0.3,0.2")
    args = parser.parse_args(argv)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    toy = {"exact": toy_cost(None)}
    for t in thresholds:
        toy[f"lossy {t}"] = toy_cost(Fraction(str(t)))
    real = real_gain(load(ModelSpec()), thresholds, args)
    body = render(toy, real, args)
    write_section("lossy", body)
    print(body)
