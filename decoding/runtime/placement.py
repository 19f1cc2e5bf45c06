"""Placing a model too large for one device with accelerate's device_map: parse and check the
options, build from_pretrained's keyword arguments, and read back where a placed model runs."""
from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import torch

from decoding.core.errors import ConfigError, check

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_PLACE = re.compile(r"^(cpu|disk|mps|\d{1,4}|cuda:\d{1,4})$")
MAX_BYTES = 2**63 - 1                  # a budget in bytes is a 64-bit signed integer


def parse_max_memory(text: str | None) -> dict[str | int, int]:
    """"0=20GiB,cpu=64GB" -> {0: 21474836480, "cpu": 64000000000}: bytes per device, GPU indices as
    ints (accelerate's form)."""
    if text is None or text.strip() == "":
        return {}
    out: dict[str | int, int] = {}
    for part in text.split(","):
        where, _, size = (s.strip() for s in part.partition("="))
        check(bool(_PLACE.match(where)) and where != "disk", "max_memory", text,
              "give DEVICE=SIZE pairs, DEVICE a GPU index or 'cpu'/'mps' (e.g. '0=20GiB,cpu=64GiB')")
        match = _SIZE.match(size)
        check(match is not None, "max_memory", text, f"{size!r} is not a size (e.g. 20GiB, 500MB)")
        key = int(where.removeprefix("cuda:")) if where[-1].isdigit() else where
        check(key not in out, "max_memory", text, f"names {where} twice")
        size_bytes = Decimal(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
        check(size_bytes <= MAX_BYTES, "max_memory", text, f"{size!r} is too large (at most {MAX_BYTES} bytes)")
        out[key] = int(size_bytes)
    return out


def check_options(device: str, device_map: str | None, max_memory: str | None, offload_folder: str | None) -> None:
    """Bad placement options raise ConfigError naming the option (called by ModelSpec)."""
    if device_map is None:
        for name, value in (("max_memory", max_memory), ("offload_folder", offload_folder)):
            check(value is None, name, value, "applies only with device_map (e.g. device_map='auto')")
        return
    check(device_map in DEVICE_MAPS, "device_map", device_map, f"choose one of {', '.join(DEVICE_MAPS)}")
    check(device == "auto", "device", device, "leave it at 'auto' with device_map: the map places the model")
    parse_max_memory(max_memory)
    check(offload_folder is None or (isinstance(offload_folder, str) and offload_folder.strip() != ""),
          "offload_folder", offload_folder, "give a directory for weights offloaded to disk")


def compute_device(max_memory: str | None) -> torch.device:
    """Where most of a placed model will compute (for the dtype choice): a GPU when CUDA is there and
    max_memory does not leave the GPUs out."""
    budget = parse_max_memory(max_memory)
    gpus = [k for k in budget if isinstance(k, int)]
    if torch.cuda.is_available() and (not budget or gpus):
        return torch.device("cuda", gpus[0] if gpus else 0)
    return torch.device("cpu")


def load_kwargs(device_map: str, max_memory: str | None, offload_folder: str | None, default_offload: Path) -> dict:
    """from_pretrained's placement arguments; needs accelerate."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ConfigError("device_map", device_map, "needs the accelerate package (pip install accelerate)") from None
    kwargs = {"device_map": device_map, "offload_folder": str(offload_folder or default_offload)}
    budget = parse_max_memory(max_memory)
    if budget:
        kwargs["max_memory"] = budget
    return kwargs


def _as_device(where) -> torch.device | None:
    if isinstance(where, int):
        return torch.device("cuda", where)
    if isinstance(where, torch.device):
        return where
    if where in ("disk", "meta"):
        return None
    return torch.device(where)


def placed_devices(model) -> dict[str, int]:
    """How many top-level placed modules sit on each device ('disk' included); {} when not placed."""
    counts: dict[str, int] = {}
    for where in (getattr(model, "hf_device_map", None) or {}).values():
        name = f"cuda:{where}" if isinstance(where, int) else str(where)
        counts[name] = counts.get(name, 0) + 1
    return counts


def compute_devices(model, fallback: torch.device) -> list[torch.device]:
    """The devices a placed model computes on (disk-offloaded modules run on accelerate's execution
    device, which is one of these or the fallback)."""
    found = {d for d in map(_as_device, (getattr(model, "hf_device_map", None) or {}).values()) if d is not None}
    return sorted(found | {fallback}, key=str)


def input_device(model) -> torch.device:
    """Where the input ids of a placed model go: the embedding's execution device."""
    embed = model.get_input_embeddings()
    hook = getattr(embed, "_hf_hook", None)
    where = getattr(hook, "execution_device", None)
    if where is not None:
        return _as_device(where) or torch.device("cpu")
    device = embed.weight.device
    return torch.device("cpu") if device.type == "meta" else device
