"""Where DecodeScope keeps files: the shipped assets, and the per-user cache (converted models, cost
tables, GEMM plans, distillation data; DECODESCOPE_CACHE overrides it)."""
from __future__ import annotations

import os
import re
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "assets"
FEATURE_WEIGHTS = ASSETS / "feature-draft-smollm2-135m.safetensors"   # the shipped feature drafter
PARALLEL_WEIGHTS = ASSETS / "dspark-smollm2-135m.safetensors"          # the shipped parallel (DSpark) drafter
DRAFTER_TARGETS = ASSETS / "drafter-targets.json"   # the fingerprint of the model the shipped drafters fit


def calibration_path(weights: Path) -> Path:
    """Where a feature drafter's calibration as DSpark's head lives: next to its weights."""
    return weights.with_suffix(".calibration.json")


def cache_root() -> Path:
    return Path(os.environ.get("DECODESCOPE_CACHE", Path.home() / ".cache" / "decodescope"))


def safe_name(text: str) -> str:
    """`text` as one file name: every run of other characters than [A-Za-z0-9_.-] becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def gemm_plan_path(model_name: str) -> Path:
    """Where the auto GEMM plan (decoding.runtime.packed_gemm) of this CPU, torch, thread count and model is cached."""
    import torch

    from decoding.runtime.packed_gemm import PACK_ROWS_HINT, cpu_name

    key = f"{cpu_name()}-torch{torch.__version__}-{torch.get_num_threads()}t-pack{PACK_ROWS_HINT}-{model_name}"
    return cache_root() / "gemm" / f"{safe_name(key)}.json"
