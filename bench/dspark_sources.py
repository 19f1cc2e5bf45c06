"""DSpark's lattice sources on the embedded model: the training-free sources (token recycling, suffix
matching; each with its memory warm from unrelated runs, and cold), the defaults ("auto": the shipped
feature head with prompt lookup), the head with token recycling composed in, and speculative decoding over
recycling and over the shipped feature drafter, interleaved in one process, on the benchmark prompts and on
fresh ones, at temperature 0 (every output checked equal to greedy's) or above (seeded).

    python -m bench dspark-sources [--repeats R] [--max-new-tokens N] [--temperature T] [--budgets 16,32]
                                   [--device cuda --dtype bfloat16 --fast-path --prompts N --md FILE]

--budgets adds token recycling + lookup (warm) with those largest tree budgets, cost-aware and as a fixed
tree: larger trees raise τ, and pay where a verification of many nodes costs about one token's (a GPU).
"""
from __future__ import annotations

import argparse

from bench import model_options
from bench.dspark import timed_run
from bench.dspark_head import DEFAULTS, SETS, budget_list, measure, report
from decoding import runner
from decoding.core.config import DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.drafters.feature_net import load_feature
from decoding.drafters.memory import SourceMemory
from decoding.train.data import distill_prompts

TRAINING_FREE = "DSpark token recycling + lookup, warm"
WARM_PROMPTS = 8            # unrelated prompts (decoding.train.data.distill_prompts) that warm the sources


class Memory:
    """The training-free sources' memory (recycling table, suffix store): empty, or the fixed warm state left
    by WARM_PROMPTS unrelated runs, a copy of which each warm contender's run starts from, so that no run sees
    any benchmark prompt's text, its own included."""

    def __init__(self, lm, n: int):
        self.lm, self.warm_state = lm, SourceMemory()
        for text in distill_prompts(WARM_PROMPTS, seed=7):
            runner.run(lm, lm.encode(text), DSparkConfig(max_new_tokens=n, drafter="recycling+suffix"),
                       memory=self.warm_state)

    def run(self, state: str, config, **kw):
        """A contender: its memory (`state`: "warm", a copy of the warm state, or "cold", an empty one),
        then the timed run."""
        def go(ids):
            memory = self.warm_state.copy() if state == "warm" else SourceMemory()
            return timed_run(self.lm, ids, config, memory=memory, **kw)
        return go


def contenders(lm, feature, args, memory: Memory) -> tuple[dict, str]:
    n, temperature = args.max_new_tokens, args.temperature
    sampled = {"temperature": temperature, "seed": 0} if temperature > 0 else {}
    reference = "sample (ours)" if temperature > 0 else "greedy (ours)"
    plain = SampleConfig(max_new_tokens=n, **sampled) if temperature > 0 else GreedyConfig(max_new_tokens=n)
    dspark = lambda state, **kw: memory.run(state, DSparkConfig(max_new_tokens=n, **sampled, **kw))  # noqa: E731
    spec = lambda state, draft, **kw: memory.run(  # noqa: E731
        state, SpeculativeConfig(max_new_tokens=n, draft=draft, gamma=8, gamma_policy="cost", **sampled), **kw)
    runs = {reference: lambda ids: timed_run(lm, ids, plain),
            TRAINING_FREE: dspark("warm", drafter="recycling"),
            "DSpark token recycling + lookup, cold": dspark("cold", drafter="recycling"),
            "DSpark recycling + suffix + lookup, warm": dspark("warm", drafter="recycling+suffix"),
            "DSpark recycling + suffix + lookup, cold": dspark("cold", drafter="recycling+suffix"),
            DEFAULTS: dspark("cold"),
            "DSpark feature head + token recycling + lookup, warm": dspark("warm", drafter="feature+recycling"),
            "speculative lookup+recycling cost-aware γ≤8, warm": spec("warm", "lookup+recycling"),
            "speculative lookup+feature cost-aware γ≤8": spec("cold", "lookup+feature", drafter=feature)}
    for b in args.budgets:
        runs[f"DSpark token recycling + lookup, warm, tree ≤ {b}"] = dspark("warm", drafter="recycling", budget=b)
        runs[f"DSpark token recycling + lookup, warm, fixed tree of {b}"] = dspark(
            "warm", drafter="recycling", budget=b, cost_table="none")
    return runs, reference


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench dspark-sources")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--budgets", type=budget_list, default=(),
                        help="token recycling with these largest tree budgets too, e.g. 16,32")
    model_options.add(parser)
    args = parser.parse_args(argv)
    lm = model_options.load_model(args)
    feature = load_feature(lm)
    memory = Memory(lm, args.max_new_tokens)
    make = lambda lm, feature, args: contenders(lm, feature, args, memory)  # noqa: E731
    sets = {title: measure(lm, feature, model_options.first(prompts, args), args, make)
            for title, prompts in SETS.items()}
    cmd = (f"python -m bench dspark-sources --repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
           f"--temperature {args.temperature:g}" + model_options.flags(args)
           + (f" --budgets {','.join(map(str, args.budgets))}" if args.budgets else ""))
    method = ("Speed: tokens/s over plain decoding's on the same prompt in the same repeat, contenders "
              "interleaved; median [min–max] over prompts × repeats. τ: tokens per target forward after the "
              "prefill. The training-free sources' memory (the recycling table, the suffix store) is set before "
              f"every run: *cold* empty, *warm* as {WARM_PROMPTS} runs on unrelated prompts "
              "(decoding.train.data.distill_prompts, seed 7) left it, so that no run sees a benchmark prompt's "
              "text, its own included. ")
    report(args, lm, sets, (f"DSpark's lattice sources: training-free and composed (temperature "
                            f"{args.temperature:g})", cmd, method), "dspark_sources")
