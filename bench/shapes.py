"""Every strategy timed on a randomly initialised model of the embedded model's shapes (SmolLM2-135M:
a llama with hidden 576, 30 layers, 9 heads, 3 key/value heads, MLP 1536, vocabulary 49152, tied
embeddings), so no weights file is needed (scripts/gpu_check.sh runs it on a GPU machine offline).

    python -m bench.shapes [--device cuda] [--dtype float16] [--max-new-tokens 128] [--tiny] [--md FILE]

A random model's text means nothing, but its step costs are the real model's; greedy decoding of a
random model soon repeats itself, so prompt lookup and the drafters get something to accept and τ is
shown as measured. Throughput is wall-clock tokens/s of the engine's whole run (trace recording
included), after one warm-up run per strategy; "events ms/step" is the mean of the steps' own phase
timings (CUDA events on a GPU), a check that the two clocks agree.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from dataclasses import dataclass

import torch

from bench.dspark import parallel_config
from decoding import runner
from decoding.core.config import BeamConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.formulas import speed_vs
from decoding.drafters.draft_model import truncated_draft
from decoding.drafters.parallel import DrafterShape, ParallelDrafter
from decoding.drafters.shallow import build_shallow
from decoding.runtime.models import LM, resolve_device, resolve_dtype

REPEATS = 3          # timed runs per strategy after the warm-up; the table shows the median
GREEDY_EXACT = ("greedy", "speculative", "dspark")
GENERATE = "transformers generate (greedy)"

EMBEDDED_SHAPES = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                       "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                       "max_position_embeddings": 8192,
                       "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True}
TINY_SHAPES = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024,
                   "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True}


@dataclass(frozen=True)
class Row:
    strategy: str
    tokens: int
    tokens_per_s: float
    events_ms_per_step: float
    tau: float | None
    peak_mib: float | None
    same_as_greedy: bool | None = None      # its tokens equal our greedy's (None: not a greedy-exact strategy)


def random_model(shapes: dict, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **shapes)
    model = LlamaForCausalLM(config).eval().to(device=device, dtype=dtype)
    model.generation_config.eos_token_id = None
    return LM(model, tokenizer=None, name="random-" + ("smollm2-135m-shapes" if shapes is EMBEDDED_SHAPES
                                                       else "tiny-shapes"), device=device)


def prompt_ids(vocab: int, length: int = 48, seed: int = 1) -> list[int]:
    """Random ids with one repeated stretch (as real prompts repeat names and phrases)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(3, vocab, (length - 16,), generator=g).tolist()
    return head + head[:16]


def contenders(lm: LM, n: int, draft_layers: int) -> dict:
    """Strategy label -> (config, extra run arguments): every registered strategy, speculative with three
    drafts (lookup, the target's first layers, a shallow self-draft of the shipped shape, untrained) and
    DSpark in both selection modes (a random drafter: its acceptances mean nothing, its costs are real)."""
    hidden = lm.model.config.hidden_size
    drafter = ParallelDrafter(DrafterShape(hidden, lm.vocab_size, gamma_max=16), seed=0).eval().attach(lm)
    draft = truncated_draft(lm, draft_layers)
    shallow = build_shallow(lm, min(2, draft_layers), 1, vocab_ids=range(min(lm.vocab_size, 12964)))
    plural = "s" if draft_layers > 1 else ""
    return {
        "greedy": (GreedyConfig(max_new_tokens=n), {}),
        "sample (T=0.8, top-p 0.9)": (SampleConfig(max_new_tokens=n, temperature=0.8, top_p=0.9, seed=1), {}),
        "beam (4 beams)": (BeamConfig(max_new_tokens=n, num_beams=4), {}),
        "speculative, lookup (γ=5)": (SpeculativeConfig(max_new_tokens=n, gamma=5, draft="lookup"), {}),
        f"speculative, draft = first {draft_layers} layer{plural} (γ=4)": (
            SpeculativeConfig(max_new_tokens=n, gamma=4, draft="truncated"), {"drafter": draft}),
        "speculative, shallow self-draft shape (γ=5)": (
            SpeculativeConfig(max_new_tokens=n, gamma=5, draft="shallow"), {"drafter": shallow}),
        "dspark, random drafter (chain γ=8, K=2)": (
            parallel_config(max_new_tokens=n, gamma=8, top_k_candidates=2), {"drafter": drafter}),
        "dspark, random drafter (tree γ=16, K=2, budget 16)": (
            parallel_config(max_new_tokens=n, gamma=16, top_k_candidates=2, select="tree", budget=16),
            {"drafter": drafter}),
    }


def _timed(lm: LM, fn) -> tuple[float, object]:
    lm.sync()
    start = time.perf_counter()
    out = fn()
    lm.sync()
    return time.perf_counter() - start, out


def _median_run(lm: LM, fn) -> tuple[float, object, float | None]:
    """fn warmed up once, then timed REPEATS times: (median seconds, that run's output, CUDA peak MiB)."""
    fn()
    if lm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(lm.device)
    runs = sorted((_timed(lm, fn) for _ in range(REPEATS)), key=lambda r: r[0])
    peak = torch.cuda.max_memory_allocated(lm.device) / 2**20 if lm.device.type == "cuda" else None
    return *runs[len(runs) // 2], peak


def measure(lm: LM, ids: list[int], config, kwargs: dict, label: str,
            greedy_ids: list[int] | None) -> tuple[Row, list[int]]:
    wall, trace, peak = _median_run(lm, lambda: runner.run(lm, ids, config, **kwargs))
    if trace.error:
        raise RuntimeError(f"{label}: {trace.error}")
    events_ms = sum(sum(step.timings_ms.values()) for step in trace.steps) / max(1, len(trace.steps))
    same = (list(trace.output_ids) == greedy_ids if greedy_ids is not None and label.startswith(GREEDY_EXACT)
            else None)
    return Row(label, len(trace.output_ids), len(trace.output_ids) / wall, events_ms,
               trace.stats.mean_accepted_length, peak, same), list(trace.output_ids)


def measure_generate(lm: LM, ids: list[int], n: int, greedy_ids: list[int]) -> Row:
    """transformers' own greedy `generate` on the same model and prompt: the baseline for our engine."""
    x = torch.tensor([ids], device=lm.device)
    kwargs = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "num_beams": 1, "pad_token_id": 0}
    with torch.inference_mode():
        wall, out, peak = _median_run(lm, lambda: lm.model.generate(x, **kwargs))
    tokens = out[0, len(ids):].tolist()
    return Row(GENERATE, len(tokens), len(tokens) / wall, float("nan"), None, peak, tokens == greedy_ids)


def measure_all(lm: LM, ids: list[int], n: int, draft_layers: int, emit=print, fast: bool = False) -> list[Row]:
    """Every contender in turn; `emit` gets the table's header, then each row as soon as it is measured
    (a run stopped at a time limit keeps the rows it finished). `fast`: then the fast path's rows."""
    for line in header(lm, n):
        emit(line)
    rows, greedy_ids = [], None
    for label, (cfg, kw) in contenders(lm, n, draft_layers).items():
        row, out_ids = measure(lm, ids, cfg, kw, label, greedy_ids)
        rows.append(row)
        if label == "greedy":
            greedy_ids = out_ids
            rows[-1] = dataclasses.replace(row, same_as_greedy=True)
            emit(row_line(rows[-1], rows[0].tokens_per_s))
            rows.append(measure_generate(lm, ids, n, greedy_ids))
        emit(row_line(rows[-1], rows[0].tokens_per_s))
    if fast:
        rows += measure_fast(lm, ids, n, draft_layers, rows, greedy_ids, emit)
    return rows


def fast_twin(lm: LM) -> LM:
    """The same model with the fast path on: CUDA graphs on a GPU, their emulation elsewhere (which
    checks the bookkeeping and its tokens, not speed)."""
    from decoding.runtime.fast_path import EmulatedGraph

    graph = None if lm.device.type == "cuda" else EmulatedGraph
    return LM(lm.model, lm.tokenizer, name=lm.name, device=lm.device, lock=lm.lock).use_fast_path(graph)


def measure_fast(lm: LM, ids: list[int], n: int, draft_layers: int, rows: list[Row], greedy_ids: list[int],
                 emit=print) -> list[Row]:
    """The strategies that decode one sequence again with the fast path (a truncated draft model on its own
    fast path too); a last line gives fast greedy over transformers' generate."""
    fast = fast_twin(lm)
    chosen = ("greedy", "sample", "speculative, lookup", "speculative, draft", "dspark")
    out = []
    for label, (cfg, kw) in contenders(fast, n, draft_layers).items():
        if not label.startswith(chosen):
            continue
        if isinstance(kw.get("drafter"), LM) and label.startswith("speculative, draft"):
            kw = {**kw, "drafter": fast_twin(kw["drafter"])}
        row, _ = measure(fast, ids, cfg, kw, label, greedy_ids)
        out.append(dataclasses.replace(row, strategy="fast path: " + label))
        emit(row_line(out[-1], rows[0].tokens_per_s))
    generate = next(r for r in rows if r.strategy == GENERATE)
    emit("")
    same = "yes" if out[0].same_as_greedy else "no"
    emit(f"Fast path: {fast.describe()['fast_path']}; fast greedy ÷ transformers generate = "
         f"{out[0].tokens_per_s / generate.tokens_per_s:.2f}× (same tokens: {same}).")
    return out


def header(lm: LM, n: int) -> list[str]:
    gpu = torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else platform.processor() or "CPU"
    import transformers

    return [f"Random model, {lm.model.config.num_hidden_layers} layers, hidden {lm.model.config.hidden_size}, "
            f"vocab {lm.vocab_size}; {str(lm.dtype).replace('torch.', '')} on {gpu}; {n} new tokens; torch "
            f"{torch.__version__}, transformers {transformers.__version__}.", "",
            f"Median of {REPEATS} timed runs after a warm-up; × greedy = tokens/s over our greedy's; same tokens = "
            "equal to our greedy's output (for the strategies that claim it); step cost = one round's wall time in "
            "greedy steps (τ ÷ × greedy): with a real drafter of mean accepted length τ', the speed-up is about "
            "τ' ÷ step cost.", "",
            "| strategy | tokens | tokens/s | × greedy | events ms/step | τ | step cost | peak MiB | same tokens |",
            "|---|---:|---:|---:|---:|---:|---:|---:|:-:|"]


def row_line(r: Row, greedy_tokens_per_s: float) -> str:
    speed = speed_vs(r.tokens_per_s, greedy_tokens_per_s)
    tau = f"{r.tau:.2f}" if r.tau is not None else "–"
    cost = f"{r.tau / speed:.2f}" if r.tau is not None else "–"
    peak = f"{r.peak_mib:.0f}" if r.peak_mib is not None else "–"
    events = "–" if r.events_ms_per_step != r.events_ms_per_step else f"{r.events_ms_per_step:.2f}"
    same = {True: "yes", False: "**no**", None: "–"}[r.same_as_greedy]
    return (f"| {r.strategy} | {r.tokens} | {r.tokens_per_s:.1f} | {speed:.2f} | {events} | {tau} | {cost} | {peak} "
            f"| {same} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shapes", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model instead (to try the script on a CPU)")
    p.add_argument("--fast-path", action="store_true", help="also time the fast path (static caches, CUDA graphs)")
    p.add_argument("--md", default=None, help="also write the table (Markdown) to this file")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    shapes = TINY_SHAPES if args.tiny else EMBEDDED_SHAPES
    start = time.perf_counter()
    lm = random_model(shapes, device, dtype)
    print(f"  built the random model in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    ids = prompt_ids(lm.vocab_size)
    n = args.max_new_tokens
    md = open(args.md, "a", encoding="utf-8") if args.md else None

    def emit(line: str) -> None:
        print(line, flush=True)
        if md:
            md.write(line + "\n")
            md.flush()

    try:
        measure_all(lm, ids, n, max(1, min(args.draft_layers, shapes["num_hidden_layers"] - 1)), emit,
                    fast=args.fast_path)
    finally:
        if md:
            md.write("\n")
            md.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
