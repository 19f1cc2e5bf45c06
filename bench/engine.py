"""Engine benchmark: tokens/s of our greedy and sampling loops (trace on) vs model.generate on the same
model, prompts and settings, interleaved in one process, several repeats.

    python -m bench engine [--repeats R] [--max-new-tokens N] [--device cuda --dtype bfloat16 --fast-path
                           --prompts N --md FILE]   (bench/model_options.py)
"""
from __future__ import annotations

import argparse
import time

import torch

from bench import model_options
from bench.memory import NOTE as MEMORY_NOTE
from bench.memory import mib_cell, peak_memory
from bench.prompts import PROMPTS
from bench.report import machine, spread
from decoding import runner
from decoding.core.config import BeamConfig, GreedyConfig, SampleConfig

SAMPLING = {"temperature": 0.8, "top_p": 0.9}
BEAMS = 4
MODES = ("greedy", "sample", "beam")          # beam: num_beams=4, length_penalty 1, no early stopping


def _generate(lm, ids, max_new: int, mode: str, seed: int) -> tuple[list[int], float]:
    """generate's new tokens and seconds. Greedy and sampling are forced to max_new tokens with
    min_new_tokens; beam search runs the same search as ours (it may end early on EOS)."""
    kwargs = {"greedy": {"do_sample": False, "min_new_tokens": max_new},
              "sample": dict(do_sample=True, top_k=0, min_new_tokens=max_new, **SAMPLING),
              "beam": {"do_sample": False, "num_beams": BEAMS, "length_penalty": 1.0, "early_stopping": False}}[mode]
    torch.manual_seed(seed)
    x = torch.tensor([ids], device=lm.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, **kwargs)
    lm.sync()
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def _ours(lm, ids, max_new: int, mode: str, seed: int) -> tuple[list[int], float]:
    cfg = {"greedy": lambda: GreedyConfig(max_new_tokens=max_new),
           "sample": lambda: SampleConfig(max_new_tokens=max_new, seed=seed, **SAMPLING),
           "beam": lambda: BeamConfig(max_new_tokens=max_new, num_beams=BEAMS)}[mode]()
    start = time.perf_counter()
    tr = runner.run(lm, ids, cfg)
    return list(tr.output_ids), time.perf_counter() - start


def measure(lm, repeats: int, max_new: int, prompts: dict | None = None) -> dict:
    """rates[mode]: tok/s of ours and generate and their ratio, one per prompt x repeat, interleaved;
    peak_ours / peak_generate: each call's peak memory above its start (MiB, bench/memory.py); same:
    whether the two outputs were equal (greedy and beam; sampled outputs use different generators)."""
    encoded = {k: lm.encode(v) for k, v in (PROMPTS if prompts is None else prompts).items()}
    rates = {m: {"ours": [], "generate": [], "ratio": [], "peak_ours": [], "peak_generate": [], "same": []}
             for m in MODES}
    for rep in range(repeats):
        for ids in encoded.values():
            for mode in MODES:
                order = (_ours, _generate) if rep % 2 == 0 else (_generate, _ours)
                res = {}
                for fn in order:
                    with peak_memory(lm.device) as mem:
                        res[fn] = fn(lm, ids, max_new, mode, rep)
                    rates[mode]["peak_ours" if fn is _ours else "peak_generate"].append(mem.above_mib)
                ours = len(res[_ours][0]) / res[_ours][1]
                theirs = len(res[_generate][0]) / res[_generate][1]
                rates[mode]["ours"].append(ours)
                rates[mode]["generate"].append(theirs)
                rates[mode]["ratio"].append(ours / theirs)
                if mode != "sample":
                    rates[mode]["same"].append(agrees(res[_ours][0], res[_generate][0], mode,
                                                      getattr(lm, "eos_ids", frozenset())))
    return rates


def agrees(ours: list[int], theirs: list[int], mode: str, eos_ids) -> bool:
    """Whether the two outputs are the same search's. Greedy: generate was forced past EOS by
    min_new_tokens, so where ours stopped at EOS the two agree on every token before it."""
    if mode == "greedy" and ours and ours[-1] in eos_ids:
        return ours[:-1] == theirs[:len(ours) - 1]
    return ours == theirs


def same_cell(same: list[bool]) -> str:
    """'yes' / 'no' / 'k of n' for the runs whose outputs were compared; '—' when none were."""
    if not same:
        return "—"
    if all(same):
        return "yes"
    return "no" if not any(same) else f"{sum(same)} of {len(same)}"


def render(rates: dict, repeats: int, max_new: int, model: str, options: str = "", prompts: int = len(PROMPTS)
           ) -> str:
    lines = ["## Engine loop vs transformers `generate`", "",
             f"Command: `python -m bench engine --repeats {repeats} --max-new-tokens {max_new}{options}`  ",
             f"Model: {model}; prompts: bench/prompts.py ({prompts}); machine: {machine()}.  ",
             "Ours runs with the full trace on (top-10 candidates, filter cuts, timings; beam search: "
             "every step's pool, kept and pruned candidates). Calls are interleaved (order alternates "
             "per repeat); greedy and sampling: generate is forced to the same length with "
             "min_new_tokens, and sampling passes top_k=0 to generate; beam: num_beams=4, "
             "length_penalty 1, early_stopping False on both sides, tokens/s counts the output's new "
             "tokens. Same output: ours equals generate's token for token (greedy: up to ours' EOS, past which "
             "min_new_tokens forces generate on; beam; sampled outputs come from different random "
             f"streams). Values: median [min–max] over prompts × "
             f"repeats. {MEMORY_NOTE}", "",
             "| mode | ours tok/s | generate tok/s | ratio ours/generate | same output | ours peak MiB | "
             "generate peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for mode, r in rates.items():
        lines.append(f"| {mode} | {spread(r['ours'])} | {spread(r['generate'])} | {spread(r['ratio'])} | "
                     f"{same_cell(r['same'])} | {mib_cell(r['peak_ours'])} | {mib_cell(r['peak_generate'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench engine")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    model_options.add(parser)
    args = parser.parse_args(argv)
    lm = model_options.load_model(args)
    for mode in MODES:
        _ours(lm, lm.encode("warm up"), 4, mode, 0)
        _generate(lm, lm.encode("warm up"), 4, mode, 0)
    prompts = model_options.first(PROMPTS, args)
    rates = measure(lm, args.repeats, args.max_new_tokens, prompts)
    model = f"{lm.name} (SmolLM2-135M-Instruct, {model_options.precision(lm)})"
    body = render(rates, args.repeats, args.max_new_tokens, model, model_options.flags(args), len(prompts))
    model_options.write(args, "engine", body)
    print(body)
