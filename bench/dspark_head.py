"""DSpark with its defaults (the feature drafter as a sequential head, prompt lookup in the lattice, a
cost-aware tree of at most 8 nodes) against plain decoding and the best speculative configurations, in
one process, interleaved: on the benchmark prompts and on fresh prompts no drafter trained on, at
temperature 0 (every contender's output equals greedy's, checked) and at temperature 0.8 (seeded; τ and
speed side by side).

    python -m bench dspark-head [--repeats R] [--max-new-tokens N] [--temperature T] [--budgets 5,6]
                                [--device cuda --dtype bfloat16 --fast-path --prompts N --md FILE]

--budgets adds DSpark's defaults with other largest tree budgets as contenders.
"""
from __future__ import annotations

import argparse
import statistics

from bench import model_options
from bench.dspark import PARALLEL, timed_run
from bench.interleave import interleaved
from bench.prompts import FRESH_PROMPTS, PROMPTS
from bench.report import machine, spread
from decoding.core.config import DSPARK_MAX_BUDGET, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.formulas import break_even_tau
from decoding.drafters.feature_net import load_feature

DEFAULTS = "DSpark defaults (feature head, cost-aware tree ≤ 8, lookup)"
GOAL_SPEED = 1.5                       # issue 25's goal: 1.5× plain greedy (floor 1.3×)
SETS = {"benchmark prompts (bench/prompts.py PROMPTS)": PROMPTS,
        "fresh prompts (bench/prompts.py FRESH_PROMPTS)": FRESH_PROMPTS}


def contenders(lm, feature, temperature: float, n: int, budgets: tuple[int, ...] = ()) -> tuple[dict, str]:
    """(name -> ids -> (tokens, seconds, trace), the reference's name); `budgets`: DSpark's defaults with
    those tree budgets too. Drafters are loaded once."""
    sampled = {"temperature": temperature, "seed": 0} if temperature > 0 else {}
    reference = "sample (ours)" if temperature > 0 else "greedy (ours)"
    plain = SampleConfig(max_new_tokens=n, top_k=0, top_p=1.0, **sampled) if temperature > 0 else \
        GreedyConfig(max_new_tokens=n)
    spec = lambda **kw: (lambda ids: timed_run(lm, ids, SpeculativeConfig(max_new_tokens=n, draft="lookup+feature",
                                                                      **sampled, **kw), drafter=feature))
    dspark = lambda **kw: (lambda ids: timed_run(lm, ids, DSparkConfig(max_new_tokens=n, **sampled, **kw)))
    runs = {reference: lambda ids: timed_run(lm, ids, plain),
            "speculative lookup+feature γ=5": spec(gamma=5),
            "speculative lookup+feature cost-aware γ≤8": spec(gamma=8, gamma_policy="cost"),
            DEFAULTS: dspark(),
            "DSpark fixed tree of 8 (feature head, lookup, no cost table)": dspark(cost_table="none"),
            "DSpark parallel drafter, chain γ=8 (the old defaults)": dspark(gamma=8, **PARALLEL)}
    runs.update({f"DSpark defaults, tree ≤ {b}": dspark(budget=b) for b in budgets})
    if temperature > 0:
        raw = raw_head(lm)
        runs[RAW_HEAD] = lambda ids: timed_run(lm, ids, DSparkConfig(max_new_tokens=n, **sampled), drafter=raw)
    return runs, reference


RAW_HEAD = "DSpark defaults, the head's q at T as ŝ (no pairs for T > 0, as before)"


def raw_head(lm):
    """The shipped head with its temperature-0 pairs only: at T > 0 its scores are its probabilities at T."""
    from decoding.drafters.factory import load_lattice_drafter
    from decoding.drafters.feature_lattice import FeatureLatticeDrafter, HeadCalibration

    head = load_lattice_drafter(lm, "feature")
    return FeatureLatticeDrafter(head.net, HeadCalibration(head.calibration.a, head.calibration.b), head.expand,
                                 head.floor)


def measure(lm, feature, prompts: dict, args, make=None) -> dict:
    """Per contender: speeds, τ and round times over the prompts; `make(lm, feature, args)` gives the
    contenders and the reference's name (default: this benchmark's)."""
    make = make or (lambda lm, feature, args: contenders(lm, feature, args.temperature, args.max_new_tokens,
                                                         args.budgets))
    runs, reference = make(lm, feature, args)
    rows = {name: {"speed": [], "tau": [], "rounds": 0, "ms": 0.0, "verify": 0.0, "draft": 0.0} for name in runs}
    encoded = [lm.encode(p) for p in prompts.values()]
    for name in runs:                       # warm-up (and the cost policy's table)
        runs[name](encoded[0][:8])
    for results in interleaved(runs, encoded, args.repeats, lm.device, reference=reference):
        ref = results[reference]
        for name, r in results.items():
            row = rows[name]
            row["speed"].append(r.speed)
            trace = r.extra
            if args.temperature == 0:
                assert trace.output_ids == ref.extra.output_ids, name     # exact: greedy's output
            if trace.stats.mean_accepted_length is not None:
                row["tau"].append(trace.stats.mean_accepted_length)
            _add_times(row, trace)
    return rows


def _add_times(row: dict, trace) -> None:
    """Rounds (prefill excluded) and their ms: in all, verifying, drafting."""
    for step in trace.steps:
        t = getattr(step, "timings_ms", None) or {}
        if getattr(step, "prefill", False) or "prefill" in t:
            continue
        row["rounds"] += 1
        row["ms"] += sum(t.values())
        row["verify"] += t.get("verification", t.get("verify", t.get("forward", 0.0)))
        row["draft"] += t.get("drafter", t.get("draft", 0.0))


def render_set(title: str, rows: dict, args) -> list[str]:
    lines = [f"### {title}, temperature {args.temperature:g}", "",
             "| contender | speed vs plain | τ | ms per round | verify ms | draft ms |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ms, verify, draft = (f"{r[key] / r['rounds']:.1f}" if r["rounds"] else "—" for key in ("ms", "verify", "draft"))
        tau = spread(r["tau"]) if r["tau"] else "—"
        lines.append(f"| {name} | {spread(r['speed'])} | {tau} | {ms} | {verify} | {draft} |")
    return lines + [""] + needed_tau(rows)


def needed_tau(rows: dict) -> list[str]:
    """The arithmetic of the goal for DSpark's defaults: the τ its measured round cost needs for parity
    with plain decoding and for GOAL_SPEED, against the τ it got."""
    name = DEFAULTS
    plain = next(iter(rows.values()))
    r = rows[name]
    if not (r["rounds"] and plain["rounds"] and r["tau"]):
        return []
    token_ms, round_ms = plain["ms"] / plain["rounds"], r["ms"] / r["rounds"]
    return [f"DSpark's defaults: a round costs {round_ms:.0f} ms against {token_ms:.0f} ms per plain token, so "
            f"parity needs τ ≥ {break_even_tau(round_ms, token_ms):.2f} and {GOAL_SPEED}× needs τ ≥ "
            f"{break_even_tau(round_ms, token_ms, GOAL_SPEED):.2f}; the runs' median τ is "
            f"{statistics.median(r['tau']):.2f}.", ""]


def budget_list(text: str) -> tuple[int, ...]:
    """"5,6" -> (5, 6): tree budgets DSparkConfig accepts."""
    try:
        budgets = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"budgets {text!r}: give comma-separated integers, e.g. 5,6") from None
    if not all(1 <= b <= DSPARK_MAX_BUDGET for b in budgets):
        raise argparse.ArgumentTypeError(f"budgets {text!r}: each must be in [1, {DSPARK_MAX_BUDGET}]")
    return budgets


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench dspark-head")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--budgets", type=budget_list, default=(),
                        help="more contenders: DSpark's defaults with these largest tree budgets, e.g. 5,6")
    model_options.add(parser)
    args = parser.parse_args(argv)
    lm = model_options.load_model(args)
    feature = load_feature(lm)
    sets = {title: measure(lm, feature, model_options.first(prompts, args), args) for title, prompts in SETS.items()}
    cmd = (f"python -m bench dspark-head --repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
           f"--temperature {args.temperature:g}")
    if args.budgets:
        cmd += f" --budgets {','.join(map(str, args.budgets))}"
    cmd += model_options.flags(args)
    method = ("Speed: tokens/s over plain decoding's (greedy, or sampling at the same temperature) on the same "
              "prompt in the same repeat, contenders interleaved; median [min–max] over prompts × repeats. τ: "
              "tokens per target forward after the prefill. Round times from the traces' timing fields (prefill "
              "excluded). ")
    report(args, lm, sets, (f"DSpark with the sequential head against speculative decoding (temperature "
                            f"{args.temperature:g})", cmd, method), "dspark_head")


def report(args, lm, sets: dict, heading: tuple[str, str, str], section: str) -> None:
    """Write and print a section: heading = (title, command, how it was measured); one table per prompt set;
    `section` names it in BENCHMARKS.md (with "_sampled" above temperature 0)."""
    title, cmd, method = heading
    body = [f"## {title}", "", f"Command: `{cmd}`  ", f"Model: {model_options.label(lm)}; machine: {machine()}.  ",
            method + ("Every contender's output was checked equal to greedy's." if args.temperature == 0 else
                      "Sampled with seed 0: outputs differ between contenders; each stays exact in distribution."),
            ""]
    for title_, rows in sets.items():
        body += render_set(title_, rows, args)
    text = "\n".join(body)
    model_options.write(args, section if args.temperature == 0 else section + "_sampled", text)
    print(text)

