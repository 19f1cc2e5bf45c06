"""Where DecodeScope keeps files: the shipped assets, and the per-user cache (converted models, cost
tables, GEMM plans, distillation data; DECODESCOPE_CACHE overrides it)."""
from __future__ import annotations

import hashlib
import os
import re
import sysconfig
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "assets"
FEATURE_WEIGHTS = ASSETS / "feature-draft-smollm2-135m.safetensors"   # the shipped feature drafter
PARALLEL_WEIGHTS = ASSETS / "dspark-smollm2-135m.safetensors"          # the shipped parallel (DSpark) drafter
SHALLOW_WEIGHTS = ASSETS / "shallow-draft-smollm2-135m.safetensors"   # the shallow self-draft (trained here)
SHIPPED_ANSWERS = ASSETS / "distill"        # the distillation answers shipped (`train answers` copies them)
DRAFTER_TARGETS = ASSETS / "drafter-targets.json"   # the fingerprint of the model the shipped drafters fit
TOUR_DIR = ASSETS / "tour"                          # the Tour's recorded traces (bench/tour.py writes them)


CACHE_KINDS = ("distill", "cost", "offload", "gemm", "serve")


def calibration_path(weights: Path) -> Path:
    """Where a feature drafter's calibration as DSpark's head lives: next to its weights."""
    return weights.with_suffix(".calibration.json")


def cache_root() -> Path:
    """DECODESCOPE_CACHE, or ~/.cache/decodescope when it is unset or empty."""
    given = os.environ.get("DECODESCOPE_CACHE", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "decodescope"


def cache_dir(kind: str) -> Path:
    """One kind of cached file's folder under cache_root(): "distill" (distillation data), "cost" (verify-cost
    tables; "cost/uploads" the app's uploads), "offload" (weights accelerate puts on disk), "gemm" (GEMM plans),
    "serve" ("serve/requests": the endpoint's request log)."""
    if kind.split("/")[0] not in CACHE_KINDS:
        raise ValueError(f"cache folder {kind!r}: not one of {', '.join(CACHE_KINDS)}")
    return cache_root() / kind


def converted_model_dir(stem: str, key: str) -> Path:
    """Where a GGUF file's converted copy (named by its stem and a key of its path, size and time) is cached."""
    return cache_root() / f"{stem}-{key}"


def shown_path(path: str | Path) -> str:
    """How an error names a file: a shipped asset or a cache file by its name alone (its folder is the
    server's business), any other path as given (the user's own)."""
    text = str(path)
    try:
        real = Path(os.path.realpath(text))
    except (OSError, ValueError):
        return text
    server = (ASSETS, cache_root(), Path(sysconfig.get_paths()["purelib"]))
    return real.name if any(real.is_relative_to(os.path.realpath(root)) for root in server) else text


def safe_name(text: str) -> str:
    """`text` as one file name: every run of other characters than [A-Za-z0-9_.-] becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def model_key(name: str) -> str:
    """A model's part of a cache file's name: its name when that is a plain name ("default", "tiny-plan"),
    else the last part of its path or id and a short hash of the whole, so that a file name (which a trace
    may carry as its cost table's source) names no folder of the machine."""
    if safe_name(name) == name:
        return name
    last = safe_name(re.split(r"[\\/]", name.rstrip("/\\"))[-1]).strip("._") or "model"
    return f"{last[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def gemm_plan_path(model_name: str) -> Path:
    """Where the auto GEMM plan (decoding.runtime.packed_gemm) of this CPU, torch, thread count and model is cached."""
    import torch

    from decoding.runtime.packed_gemm import PACK_ROWS_HINT, cpu_name

    machine = f"{cpu_name()}-torch{torch.__version__}-{torch.get_num_threads()}t-pack{PACK_ROWS_HINT}"
    key = f"{machine}-{model_key(model_name)}"
    return cache_dir("gemm") / f"{safe_name(key)}.json"
