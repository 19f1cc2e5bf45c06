"""How fast the target writes its distillation answers: transformers' generate on batches of prompts in
the given order (the way answers were made until decoding/train/greedy_batch.py) against greedy_batch
(prompts sorted by length, finished rows leave the batch, logits of the last position only). Both run on
the same prompts in one process, alternating order per repeat; the table gives answer tokens per second,
the ratio, and how many answers the two give alike (they may part on a near-tie: other batch
compositions round differently).

    python -m bench distill-gen [--n-prompts N] [--batch B] [--answer-tokens T] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.report import machine, spread, write_section
from decoding.train import data
from decoding.train.greedy_batch import greedy_answers

GENERATE, BATCHED = "generate (transformers)", "greedy_batch"


def measure(lm, prompts, answer_tokens: int, batch: int, repeats: int) -> tuple[dict, list[list[int]], list]:
    """({contender: [tokens/s per repeat]}, generate's answers, greedy_batch's answers)."""
    runs = {GENERATE: lambda: data.generate_answers(lm, prompts, answer_tokens, batch, 0.0, 0),
            BATCHED: lambda: greedy_answers(lm, prompts, answer_tokens, batch)}
    rates: dict[str, list[float]] = {name: [] for name in runs}
    answers = {}
    for rep in range(repeats):
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            start = time.perf_counter()
            answers[name] = runs[name]()
            rates[name].append(sum(map(len, answers[name])) / (time.perf_counter() - start))
    return rates, answers[GENERATE], answers[BATCHED]


def render(rates: dict, theirs, ours, args) -> str:
    ratios = [b / g for g, b in zip(rates[GENERATE], rates[BATCHED])]
    alike = sum(a == b for a, b in zip(theirs, ours))
    tokens = sum(map(len, ours))
    return "\n".join([
        "## Distillation answers: batched greedy against transformers' generate", "",
        f"Command: `python -m bench distill-gen --n-prompts {args.n_prompts} --batch {args.batch} "
        f"--answer-tokens {args.answer_tokens} --repeats {args.repeats}`  ",
        f"Model: SmolLM2-135M-Instruct (embedded), fp32; machine: {machine()}.  ",
        f"Prompts: the first {args.n_prompts} templated distillation prompts (decoding.train.data.distill_prompts, "
        f"chat template), {tokens} answer tokens; contenders alternate order per repeat.", "",
        "| contender | answer tokens/s, median [min–max] |", "|---|---|",
        f"| {GENERATE} | {spread(rates[GENERATE])} |",
        f"| {BATCHED} | {spread(rates[BATCHED])} |", "",
        f"Ratio greedy_batch / generate per repeat: {spread(ratios)}. Answers alike: {alike} of {len(ours)} "
        f"(mean answer {statistics.mean(map(len, ours)):.1f} tokens).",
    ])


def main(argv=None) -> None:
    from decoding.runtime.models import ModelSpec, load

    parser = argparse.ArgumentParser(prog="python -m bench distill-gen")
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    lm = load(ModelSpec())
    prompts = [lm.encode(t) for t in data.distill_prompts(args.n_prompts)]
    rates, theirs, ours = measure(lm, prompts, args.answer_tokens, args.batch, args.repeats)
    body = render(rates, theirs, ours, args)
    print(body)
    write_section("distill-gen", body)
