"""How fast the target writes a distillation part. Answers alone: transformers' generate on batches of
prompts in the given order (the way answers were made until decoding/train/greedy_batch.py) against
greedy_batch (prompts sorted by length, finished rows leave the batch, logits of the last position only).
A whole part (answers, LM-head inputs, top-8 soft labels): generate followed by the teacher-forced pass
over prompt + answer, against greedy_rows, which keeps the rows of its own decoding steps. All run on the
same prompts in one process, alternating order per repeat; the table gives answer tokens per second, the
ratios, and how many answers generate and greedy_batch give alike (they may part on a near-tie: other
batch compositions round differently).

    python -m bench distill-gen [--n-prompts N] [--batch B] [--answer-tokens T] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.report import machine, spread, write_section
from decoding.train import data
from decoding.train.greedy_batch import greedy_answers, greedy_rows

GENERATE, BATCHED = "generate (transformers)", "greedy_batch"
TEACHER, ROWS = "generate + teacher pass", "greedy_rows (rows kept)"
SOFT_K = 8


def contenders(lm, prompts, answer_tokens: int, batch: int) -> dict:
    """{name: () -> answers as token lists}."""
    def with_teacher():
        answers = data.generate_answers(lm, prompts, answer_tokens, batch, 0.0, 0)
        data._teacher_rows(lm, prompts, answers, batch, SOFT_K, progress=False)
        return answers

    return {GENERATE: lambda: data.generate_answers(lm, prompts, answer_tokens, batch, 0.0, 0),
            BATCHED: lambda: greedy_answers(lm, prompts, answer_tokens, batch),
            TEACHER: with_teacher,
            ROWS: lambda: [a.tokens for a in greedy_rows(lm, prompts, answer_tokens, batch, SOFT_K)]}


def measure(lm, prompts, answer_tokens: int, batch: int, repeats: int) -> tuple[dict, dict]:
    """({contender: [tokens/s per repeat]}, {contender: its answers})."""
    runs = contenders(lm, prompts, answer_tokens, batch)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    answers = {}
    for rep in range(repeats):
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            start = time.perf_counter()
            answers[name] = runs[name]()
            rates[name].append(sum(map(len, answers[name])) / (time.perf_counter() - start))
    return rates, answers


def render(rates: dict, answers: dict, args) -> str:
    def ratio(ours: str, theirs: str) -> str:
        return spread([b / a for a, b in zip(rates[theirs], rates[ours])])

    theirs, ours = answers[GENERATE], answers[BATCHED]
    alike = sum(a == b for a, b in zip(theirs, ours))
    tokens = sum(map(len, ours))
    return "\n".join([
        "## Distillation answers: batched greedy against transformers' generate", "",
        f"Command: `python -m bench distill-gen --n-prompts {args.n_prompts} --batch {args.batch} "
        f"--answer-tokens {args.answer_tokens} --repeats {args.repeats}`  ",
        f"Model: SmolLM2-135M-Instruct (embedded), fp32; machine: {machine()}.  ",
        f"Prompts: the first {args.n_prompts} templated distillation prompts (decoding.train.data.distill_prompts, "
        f"chat template), {tokens} answer tokens; contenders alternate order per repeat. A whole part adds the "
        f"LM-head inputs and top-{SOFT_K} soft labels of every answer position.", "",
        "| contender | answer tokens/s, median [min–max] |", "|---|---|",
        *(f"| {name} | {spread(rates[name])} |" for name in (GENERATE, BATCHED, TEACHER, ROWS)), "",
        f"Answers alone, greedy_batch / generate per repeat: {ratio(BATCHED, GENERATE)}. A whole part, "
        f"greedy_rows / (generate + teacher pass): {ratio(ROWS, TEACHER)}. Answers alike: {alike} of {len(ours)} "
        f"(mean answer {statistics.mean(map(len, ours)):.1f} tokens); greedy_rows' answers equal greedy_batch's: "
        f"{answers[ROWS] == ours}.",
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
    rates, answers = measure(lm, prompts, args.answer_tokens, args.batch, args.repeats)
    body = render(rates, answers, args)
    print(body)
    write_section("distill-gen", body)
