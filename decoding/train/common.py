"""What every trainer's command line shares: a flag per settings field, load the model, train, one line."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from decoding.core.errors import ConfigError
from decoding.runtime.files import check_writable, write_text_atomic


def display_name(lm) -> str:
    """The target's name for model cards ("default" is the embedded model)."""
    from decoding.runtime.models import DEFAULT_MODEL, EMBEDDED_GGUF

    return f"{EMBEDDED_GGUF.removesuffix('.gguf')} (embedded)" if lm.name == DEFAULT_MODEL else lm.name


def target_meta(lm) -> dict:
    """What a drafter file's metadata records of its target beside its name: its fingerprint, so that the file is
    refused on any other model (decoding.runtime.fingerprint.check_trained_for)."""
    from decoding.runtime.fingerprint import TARGET_KEY, fingerprint

    return {TARGET_KEY: fingerprint(lm)}


def default_weights(model: str, shipped: Path, prefix: str) -> Path:
    """A trainer's weights file when --out (or --draft) is not given: the shipped asset for the embedded model,
    else <prefix>-<model's name>.safetensors here."""
    return shipped if model == "default" else Path(f"{prefix}-{Path(model).name}.safetensors")


def settings_parser(prog: str, description: str, settings_type) -> argparse.ArgumentParser:
    """--model, --out, one flag per field of the settings dataclass, --no-progress."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--model", default="default")
    p.add_argument("--model-dtype", default="auto", help="the target's dtype (auto: float32 on a CPU, float16 on a "
                   "GPU; float32 keeps a GPU's distillation keys and answers those of the CPU)")
    p.add_argument("--out", default=None, help="weights file (default: the shipped asset for the embedded model)")
    for name, value in asdict(settings_type()).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument("--no-progress", action="store_true")
    return p


def target_spec(args):
    """The target's ModelSpec from --model and --model-dtype."""
    from decoding.runtime.models import ModelSpec

    return ModelSpec(args.model, dtype=args.model_dtype)


def run_trainer(argv, parser: argparse.ArgumentParser, settings_type, shipped: Path, prefix: str, train,
                summary) -> int:
    """Parse, load the model, train to --out (or the shipped asset for the embedded model, else
    <prefix>-<model>.safetensors), print one line; one-line errors with exit status 2."""
    from decoding.runtime.models import load

    args = parser.parse_args(argv)
    try:
        settings = settings_type(**{k: v for k, v in vars(args).items() if k in settings_type.__dataclass_fields__})
        out = args.out or default_weights(args.model, shipped, prefix)
        check_writable(out, "out")                     # before the model loads and the hours of training
        check_writable(Path(out).with_suffix(".md"), "out")   # its model card, written beside it
        lm = load(target_spec(args))
        report = train(lm, settings, out, progress=not args.no_progress)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {report.weights} ({report.size_bytes / 1e6:.1f} MB) and its model card; {summary(report)}")
    return 0


def finish(report, out: Path, card: Callable[[object], str]):
    """Put the weights file's path and size on the report and write its model card beside it."""
    report.weights, report.size_bytes = str(out), out.stat().st_size
    write_text_atomic(out.with_suffix(".md"), card(report))
    return report


def tau_summary(tau_chain: dict) -> str:
    """The one-line τ(chain) summary a trainer prints: {γ: τ} rounded to 2 decimals."""
    return "tau(chain) " + json.dumps({k: round(v, 2) for k, v in tau_chain.items()})
