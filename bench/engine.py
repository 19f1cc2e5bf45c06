"""Engine benchmark: tokens/s of our greedy and sampling loops (trace on) vs model.generate on the same
model, prompts and settings, interleaved in one process, several repeats.

    python -m bench engine [--repeats R] [--max-new-tokens N]
"""
from __future__ import annotations

import argparse
import time

import torch

from bench.memory import NOTE as MEMORY_NOTE
from bench.memory import mib_cell, peak_memory
from bench.prompts import PROMPTS
from bench.report import machine, spread, write_section
from decoding import runner
from decoding.config import GreedyConfig, SampleConfig
from decoding.models import ModelSpec, load

SAMPLING = dict(temperature=0.8, top_p=0.9)


def _generate(lm, ids, max_new: int, sample: bool, seed: int) -> tuple[int, float]:
    kwargs = dict(do_sample=True, top_k=0, **SAMPLING) if sample else dict(do_sample=False)
    torch.manual_seed(seed)
    x = torch.tensor([ids], device=lm.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, max_new_tokens=max_new, min_new_tokens=max_new, **kwargs)
    lm.sync()
    return out.shape[1] - len(ids), time.perf_counter() - start


def _ours(lm, ids, max_new: int, sample: bool, seed: int) -> tuple[int, float]:
    cfg = (SampleConfig(max_new_tokens=max_new, seed=seed, **SAMPLING) if sample
           else GreedyConfig(max_new_tokens=max_new))
    start = time.perf_counter()
    tr = runner.run(lm, ids, cfg)
    return len(tr.output_ids), time.perf_counter() - start


def measure(lm, repeats: int, max_new: int) -> dict:
    """rates[mode]: tok/s of ours and generate and their ratio, one per prompt x repeat, interleaved;
    peak_ours / peak_generate: each call's peak memory above its start (MiB, bench/memory.py)."""
    encoded = {k: lm.encode(v) for k, v in PROMPTS.items()}
    rates = {m: {"ours": [], "generate": [], "ratio": [], "peak_ours": [], "peak_generate": []}
             for m in ("greedy", "sample")}
    for rep in range(repeats):
        for name, ids in encoded.items():
            for mode in ("greedy", "sample"):
                sample = mode == "sample"
                order = (_ours, _generate) if rep % 2 == 0 else (_generate, _ours)
                res = {}
                for fn in order:
                    with peak_memory(lm.device) as mem:
                        res[fn] = fn(lm, ids, max_new, sample, rep)
                    rates[mode]["peak_ours" if fn is _ours else "peak_generate"].append(mem.above_mib)
                ours = res[_ours][0] / res[_ours][1]
                theirs = res[_generate][0] / res[_generate][1]
                rates[mode]["ours"].append(ours)
                rates[mode]["generate"].append(theirs)
                rates[mode]["ratio"].append(ours / theirs)
    return rates


def render(rates: dict, repeats: int, max_new: int, model: str) -> str:
    lines = ["## Engine loop vs transformers `generate`", "",
             f"Command: `python -m bench engine --repeats {repeats} --max-new-tokens {max_new}`  ",
             f"Model: {model}; prompts: bench/prompts.py ({len(PROMPTS)}); machine: {machine()}.  ",
             "Ours runs with the full trace on (top-10 candidates, filter cuts, timings). Calls are "
             "interleaved (order alternates per repeat); generate is forced to the same length "
             "with min_new_tokens; sampling passes top_k=0 to generate. Values: median [min–max] over "
             f"prompts × repeats. {MEMORY_NOTE}", "",
             "| mode | ours tok/s | generate tok/s | ratio ours/generate | ours peak MiB | generate peak MiB |",
             "|---|---|---|---|---|---|"]
    for mode, r in rates.items():
        lines.append(f"| {mode} | {spread(r['ours'])} | {spread(r['generate'])} | {spread(r['ratio'])} | "
                     f"{mib_cell(r['peak_ours'])} | {mib_cell(r['peak_generate'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench engine")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    lm = load(ModelSpec())
    _ours(lm, lm.encode("warm up"), 4, False, 0)
    _generate(lm, lm.encode("warm up"), 4, False, 0)
    rates = measure(lm, args.repeats, args.max_new_tokens)
    body = render(rates, args.repeats, args.max_new_tokens, lm.name + " (SmolLM2-135M-Instruct, fp32)")
    write_section("engine", body)
    print(body)
