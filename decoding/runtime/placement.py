"""Where a model placed with accelerate's device_map runs: the device it computes on (for the dtype choice),
its modules' devices and where its input ids go. Its options are parsed and checked in
decoding/runtime/model_spec.py (torch-free)."""
from __future__ import annotations

import torch

from decoding.runtime.model_spec import parse_max_memory


def compute_device(max_memory: str | None) -> torch.device:
    """Where most of a placed model will compute (for the dtype choice): a GPU when CUDA is there and
    max_memory does not leave the GPUs out."""
    budget = parse_max_memory(max_memory)
    gpus = [k for k in budget if isinstance(k, int)]
    if torch.cuda.is_available() and (not budget or gpus):
        return torch.device("cuda", gpus[0] if gpus else 0)
    return torch.device("cpu")


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
