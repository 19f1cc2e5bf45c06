"""What names one model copy, checked: `ModelSpec` (model, device, dtype, placement options), the choices it
accepts and the parsing of accelerate's placement options. Loads no torch, so the app checks a sidebar's
choices before any model is loaded; loading is decoding/runtime/models.py, where a placed model runs
decoding/runtime/placement.py."""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from decoding.core.errors import ConfigError, check
from decoding.runtime.paths import cache_dir

DEFAULT_MODEL = "default"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16")   # torch's names; auto: float32 on the CPU, float16 elsewhere
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_PLACE = re.compile(r"^(cpu|disk|mps|\d{1,4}|cuda:\d{1,4})$")
MAX_BYTES = 2**63 - 1                  # a budget in bytes is a 64-bit signed integer


@dataclass(frozen=True)
class ModelSpec:
    name: str = DEFAULT_MODEL           # "default", an HF id, a directory or a .gguf file
    gguf_file: str | None = None        # GGUF file name inside `name` (a directory or HF repo)
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    device_map: str | None = None       # None: all on `device`; "auto" etc.: accelerate places the model
    max_memory: str | None = None       # with device_map: "0=20GiB,cpu=64GiB" (GPU index or cpu = size)
    offload_folder: str | None = None   # with device_map: where weights offloaded to disk go
    pack_gemm: bool = True              # CPU fp32: the GEMM plan (decoding.runtime.packed_gemm); False: plain sgemm
    fast_path: bool = False             # CUDA: static KV caches and CUDA graphs (decoding.runtime.fast_path)

    def __post_init__(self):
        check(isinstance(self.name, str) and self.name.strip() != "", "model", self.name,
              "give 'default', a model id or a local path")
        check(self.device in DEVICES, "device", self.device, f"choose one of {', '.join(DEVICES)}")
        check(self.dtype in DTYPES, "dtype", self.dtype, f"choose one of {', '.join(DTYPES)}")
        check_options(self.device, self.device_map, self.max_memory, self.offload_folder)
        check(isinstance(self.pack_gemm, bool), "pack_gemm", self.pack_gemm, "must be true or false")
        check(isinstance(self.fast_path, bool), "fast_path", self.fast_path, "must be true or false")
        check(not (self.fast_path and self.device_map), "fast_path", self.fast_path,
              "needs the whole model on one GPU (leave out --device-map)")

    def placement_kwargs(self) -> dict:
        """from_pretrained's device_map / max_memory / offload_folder ({} when not placed)."""
        if self.device_map is None:
            return {}
        return load_kwargs(self.device_map, self.max_memory, self.offload_folder, cache_dir("offload"))


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
