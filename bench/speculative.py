"""Speculative benchmark: our prompt lookup and draft-model speculative decoding vs plain greedy, and vs
transformers' prompt-lookup / assisted generation with the same draft, interleaved in one process.

    python -m bench speculative [--repeats R] [--max-new-tokens N] [--gamma G] [--draft-layers L]

Prompts use the chat template. transformers' assisted generation gives the assistant no attention mask,
so it hides every token equal to the pad id; SmolLM2's pad id is <|im_end|>, which the chat template
uses, so the benchmark sets the pad id to <|endoftext|> (id 0, absent from the prompts) for generate.
The draft model is the shipped shallow self-draft (decoding/shallow.py) when its weights exist, else
the target's first L layers, untrained (`--draft-layers`).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.memory import NOTE as MEMORY_NOTE
from bench.memory import mib_cell, peak_memory
from bench.prompts import PROMPTS
from bench.report import machine, spread, write_section
from decoding import runner
from decoding.config import GreedyConfig, SpeculativeConfig
from decoding.drafters import truncated_draft
from decoding.shallow import DEFAULT_SHALLOW, load_shallow
from decoding.models import ModelSpec, load


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _ours(lm, ids, cfg, **kw):
    tr, wall = _timed(lambda: runner.run(lm, ids, cfg, **kw))
    return len(tr.output_ids), wall, tr.stats


def _generate(lm, ids, max_new, **kw):
    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        out, wall = _timed(lambda: lm.model.generate(x, do_sample=False, max_new_tokens=max_new, **kw))
    return out.shape[1] - len(ids), wall, None


def contenders(lm, draft, args) -> dict:
    n, g = args.max_new_tokens, args.gamma
    draft.model.generation_config.num_assistant_tokens = g
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0
    return {
        "greedy (ours)": lambda ids: _ours(lm, ids, GreedyConfig(max_new_tokens=n)),
        "lookup (ours)": lambda ids: _ours(lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=10)),
        "lookup (generate)": lambda ids: _generate(lm, ids, n, prompt_lookup_num_tokens=10),
        f"{draft.name} γ={g} (ours)": lambda ids: _ours(
            lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=g, draft="model"), draft_lm=draft),
        f"{draft.name} γ={g} (generate assisted)": lambda ids: _generate(
            lm, ids, n, assistant_model=draft.model),
        "greedy (generate)": lambda ids: _generate(lm, ids, n),
    }


def measure(lm, draft, args) -> dict:
    runs = contenders(lm, draft, args)
    rows = {name: {"tps": [], "tau": [], "acc": [], "peak": []} for name in runs}
    encoded = [lm.encode(p) for p in PROMPTS.values()]
    for model in (lm.model, draft.model):
        model.generation_config.pad_token_id = 0  # see the module docstring
    for rep in range(args.repeats):
        for ids in encoded:
            base_tps = None
            names = list(runs) if rep % 2 == 0 else list(reversed(runs))
            results = {}
            for name in names:
                with peak_memory(lm.device) as mem:
                    results[name] = runs[name](ids)
                rows[name]["peak"].append(mem.above_mib)
            base_tps = results["greedy (ours)"][0] / results["greedy (ours)"][1]
            for name, (tokens, wall, stats) in results.items():
                rows[name]["tps"].append(tokens / wall / base_tps)
                if stats is not None and stats.mean_accepted_length is not None:
                    rows[name]["tau"].append(stats.mean_accepted_length)
                    rows[name]["acc"].append(stats.acceptance_rate or 0.0)
    return rows


def draft_note(args) -> str:
    if DEFAULT_SHALLOW.is_file():
        return ("the shipped shallow self-draft (assets/shallow-draft-smollm2-135m.safetensors; target layers "
                "shared + trained adapter, sliced head), the same model object for ours and assisted generation")
    return f"the target's first {args.draft_layers} layers, untrained (no shallow-draft weights found)"


def render(rows, args, model) -> str:
    lines = ["## Speculative decoding vs plain greedy and transformers", "",
             f"Command: `python -m bench speculative --repeats {args.repeats} --max-new-tokens "
             f"{args.max_new_tokens} --gamma {args.gamma} --draft-layers {args.draft_layers}`  ",
             f"Model: {model}; prompts: bench/prompts.py (chat template; pad id 0 for generate); machine: {machine()}.  ",
             "Speed is tokens/s relative to our plain greedy on the same prompt in the same repeat "
             "(all contenders interleaved, order alternating). Temperature 0 throughout. "
             f"Draft model: {draft_note(args)}. Values: median [min–max] over prompts × repeats. {MEMORY_NOTE}", "",
             "| contender | speed vs our greedy | τ (tokens / target forward) | acceptance rate | peak MiB |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        tau = spread(r["tau"]) if r["tau"] else "—"
        acc = f"{statistics.median(r['acc']):.3f}" if r["acc"] else "—"
        lines.append(f"| {name} | {spread(r['tps'])} | {tau} | {acc} | {mib_cell(r['peak'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench speculative")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--draft-layers", type=int, default=4)
    args = parser.parse_args(argv)
    lm = load(ModelSpec())
    draft = load_shallow(lm) if DEFAULT_SHALLOW.is_file() else truncated_draft(
        lm, args.draft_layers, name=f"untrained early exit L={args.draft_layers}")
    draft.name = "shallow draft" if DEFAULT_SHALLOW.is_file() else draft.name
    rows = measure(lm, draft, args)
    body = render(rows, args, "SmolLM2-135M-Instruct (embedded), fp32")
    write_section("speculative", body)
    print(body)
