"""Options the embedded-model benchmarks share for runs off this machine's CPU (scripts/gpu_check.sh --real):
the device, dtype and fast path the model loads with, how many prompts of each set run, and a file that
takes the section instead of BENCHMARKS.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.report import write_section
from decoding.runtime.model_spec import DEVICES, DTYPES, ModelSpec
from decoding.runtime.models import LM, load


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="where the model runs (default: cpu)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the model's dtype (default: float32)")
    parser.add_argument("--fast-path", action="store_true", help="CUDA: static KV caches and CUDA graphs")
    parser.add_argument("--prompts", type=int, default=0, help="the first N prompts of each set (default: all)")
    parser.add_argument("--md", type=Path, default=None,
                        help="append the section to this file instead of writing it into BENCHMARKS.md")


def load_model(args: argparse.Namespace) -> LM:
    return load(ModelSpec(device=args.device, dtype=args.dtype, fast_path=args.fast_path))


def first(prompts: dict, args: argparse.Namespace) -> dict:
    """The first args.prompts entries of a prompt set (all of them when it is 0)."""
    return dict(list(prompts.items())[:args.prompts]) if args.prompts > 0 else prompts


def precision(lm: LM) -> str:
    """The dtype, and the device and fast path where they are not the CPU's defaults: 'fp32', 'bf16 on cuda'."""
    dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[str(lm.dtype).replace("torch.", "")]
    where = "" if lm.device.type == "cpu" else f" on {lm.device.type}"
    return dtype + where + (", fast path" if lm.fast is not None else "")


def label(lm: LM) -> str:
    """The model as a section names it: 'SmolLM2-135M-Instruct (embedded), fp32' on the CPU's defaults."""
    return f"SmolLM2-135M-Instruct (embedded), {precision(lm)}"


def flags(args: argparse.Namespace) -> str:
    """The options that differ from the defaults, as the section's command line repeats them."""
    out = [f"--device {args.device}"] if args.device != "cpu" else []
    out += [f"--dtype {args.dtype}"] if args.dtype != "float32" else []
    out += ["--fast-path"] if args.fast_path else []
    out += [f"--prompts {args.prompts}"] if args.prompts > 0 else []
    return "".join(" " + f for f in out)


def write(args: argparse.Namespace, name: str, body: str) -> None:
    """The section into BENCHMARKS.md, or appended to --md."""
    if args.md is None:
        write_section(name, body)
        return
    with open(args.md, "a", encoding="utf-8") as out:
        out.write(body.rstrip() + "\n\n")
