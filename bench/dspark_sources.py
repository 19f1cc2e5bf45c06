"""DSpark's lattice sources on the embedded model: token recycling alone (training-free; with the table warm
from the earlier runs in the process, and cold, cleared before each run), the defaults ("auto": the shipped
feature head with prompt lookup), the head with token recycling composed in, and the best speculative
configuration, interleaved in one process, on the benchmark prompts and on fresh ones, at temperature 0
(every output checked equal to greedy's) or above (seeded).

    python -m bench dspark-sources [--repeats R] [--max-new-tokens N] [--temperature T]
                                   [--device cuda --dtype bfloat16 --fast-path --prompts N --md FILE]
"""
from __future__ import annotations

import argparse

from bench import model_options
from bench.dspark import timed_run
from bench.dspark_head import DEFAULTS, SETS, measure, render_set
from bench.report import machine
from decoding.core.config import DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.drafters.feature_net import load_feature
from decoding.drafters.recycling import table_for

TRAINING_FREE = "DSpark training-free (token recycling + lookup), table warm"


def contenders(lm, feature, args) -> tuple[dict, str]:
    n, temperature = args.max_new_tokens, args.temperature
    sampled = {"temperature": temperature, "seed": 0} if temperature > 0 else {}
    reference = "sample (ours)" if temperature > 0 else "greedy (ours)"
    plain = SampleConfig(max_new_tokens=n, **sampled) if temperature > 0 else GreedyConfig(max_new_tokens=n)
    dspark = lambda **kw: (lambda ids: timed_run(lm, ids, DSparkConfig(max_new_tokens=n, **sampled, **kw)))

    def cold(ids):
        table_for(lm).clear()
        return timed_run(lm, ids, DSparkConfig(max_new_tokens=n, drafter="recycling", **sampled))

    runs = {reference: lambda ids: timed_run(lm, ids, plain),
            TRAINING_FREE: dspark(drafter="recycling"),
            "DSpark training-free, table cleared before each run": cold,
            DEFAULTS: dspark(),
            "DSpark feature head + token recycling + lookup": dspark(drafter="feature+recycling"),
            "speculative lookup+feature cost-aware γ≤8": lambda ids: timed_run(
                lm, ids, SpeculativeConfig(max_new_tokens=n, draft="lookup+feature", gamma=8, gamma_policy="cost",
                                           **sampled), draft_lm=feature)}
    return runs, reference


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench dspark-sources")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    model_options.add(parser)
    args = parser.parse_args(argv)
    args.budgets = ()
    lm = model_options.load_model(args)
    feature = load_feature(lm)
    table_for(lm).clear()
    sets = {title: measure(lm, feature, model_options.first(prompts, args), args, contenders)
            for title, prompts in SETS.items()}
    cmd = (f"python -m bench dspark-sources --repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
           f"--temperature {args.temperature:g}" + model_options.flags(args))
    body = [f"## DSpark's lattice sources: training-free and composed (temperature {args.temperature:g})", "",
            f"Command: `{cmd}`  ",
            f"Model: {model_options.label(lm)}; machine: {machine()}.  ",
            "Speed: tokens/s over plain decoding's on the same prompt in the same repeat, contenders interleaved; "
            "median [min–max] over prompts × repeats. τ: tokens per target forward after the prefill. The "
            "recycling table starts empty and is shared by the runs that use it, in the order they ran (the "
            "benchmark prompts after the fresh ones), except for the contender that clears it before each run. "
            + ("Every contender's output was checked equal to greedy's." if args.temperature == 0 else
               "Sampled with seed 0: outputs differ between contenders; each stays exact in distribution."), ""]
    for title, rows in sets.items():
        body += render_set(title, rows, args)
    text = "\n".join(body)
    model_options.write(args, "dspark_sources" if args.temperature == 0 else "dspark_sources_sampled", text)
    print(text)
