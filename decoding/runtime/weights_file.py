"""Drafter weights files (safetensors): float tensors stored as float16, a string header with the format
name and metadata; reading checks the format first, so a wrong file is a one-line `draft` error, and
any damage found while reading one (`reading`) is one line naming the file."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from decoding.core.errors import ConfigError, check
from decoding.runtime.files import atomic_path
from decoding.runtime.paths import shown_path


def save_weights(state: dict[str, torch.Tensor], path: str | Path, header: dict[str, str]) -> None:
    """`state` as float16 safetensors at `path`, atomically (atomic_path: a device or a pipe is written in place;
    safetensors' own save_file would replace it with a regular file)."""
    from safetensors.torch import save

    stored = {k: (v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()).contiguous()
              for k, v in state.items()}
    bad = non_finite(stored)
    check(bad is None, "out", shown_path(path), f"not written: {bad} of the weights are NaN or infinite in float16 "
                                                "(training diverged: try a lower --lr)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = save(stored, metadata=header)
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        file.write(data)


@contextmanager
def reading(param: str, path: str | Path) -> Iterator[None]:
    """Inside the block, any failure reading the weights file at `path` (not safetensors, truncated, a
    tensor or header entry missing, a header value out of range) becomes one line naming `param` and the
    file: "could not be read (...)". A ConfigError that already names `param` passes unchanged."""
    try:
        yield
    except ConfigError as err:
        if err.param == param:
            raise
        raise ConfigError(param, shown_path(path), f"could not be read ({err})") from None
    except Exception as err:  # noqa: BLE001 - a damaged file becomes one line
        raise ConfigError(param, shown_path(path), f"could not be read ({damage(err)})") from None


def non_finite(state: dict[str, torch.Tensor]) -> str | None:
    """'N in NAME' for the first float tensor of `state` holding NaN or ±inf (N of them); None when all are
    finite."""
    for name, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"{int((~torch.isfinite(value)).sum())} in {name!r}"
    return None


def check_finite(state: dict[str, torch.Tensor], param: str, path: str | Path) -> None:
    """Every weight read from the file at `path` finite: NaN weights would draft garbage, silently."""
    bad = non_finite(state)
    check(bad is None, param, shown_path(path), f"holds NaN or infinite weights ({bad}); train it again")


def damage(err: Exception) -> str:
    """What went wrong reading a file, in one short line."""
    if isinstance(err, KeyError):
        return f"{err.args[0]!r} is missing" if err.args else "an entry is missing"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    text = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]     # "Error(s) in loading ...:" + what
    return text[:160]


def read_header(path: str | Path, weights_format: str, what: str, param: str = "draft") -> dict[str, str]:
    """The file's header, after checking that it is a `weights_format` file (else: param=PATH is not a
    `what` weights file; a damaged file: param=PATH could not be read)."""
    from safetensors import safe_open

    with reading(param, path), safe_open(str(path), "pt") as f:
        header = f.metadata() or {}
    check(header.get("format") == weights_format, param, shown_path(path),
          f"is not a {what} weights file (format {header.get('format')!r})")
    return header


def header_object(header: dict[str, str], key: str, param: str, path: str | Path) -> dict:
    """The header entry `key` read as a JSON object ({} when absent); one line naming `param` and the file when it
    is not JSON or not an object (a list, a number: its fields would be read later, far from the file)."""
    try:
        value = json.loads(header.get(key, "{}"))
    except ValueError as err:
        raise ConfigError(param, shown_path(path), f"could not be read (its {key!r} is not JSON: {err})") from None
    check(isinstance(value, dict), param, shown_path(path),
          f"could not be read (its {key!r} is a JSON {type(value).__name__}, not an object)")
    return value


def build_from_file(build: Callable[[], nn.Module], state: dict[str, torch.Tensor], blocks: int, param: str,
                    path: str | Path) -> nn.Module:
    """The module `build()` makes from a file's header, loaded with the file's tensors `state` (float32). Built
    first on the meta device (no memory): its tensors must be the file's, name for name and shape for shape, so
    that the memory a drafter takes is bounded by the file's own size, whatever numbers its header holds;
    `blocks` (the repeated blocks the header asks for, each with a tensor at least) is checked against the
    file's tensors before that. One line naming `param` and the file otherwise."""
    shown = shown_path(path)
    check(blocks <= len(state), param, shown, f"could not be read (its header asks for {blocks} blocks; the file "
                                              f"holds {len(state)} tensors)")
    with torch.device("meta"):
        skeleton = build()
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    for name in sorted(want.keys() | have.keys()):
        check(want.get(name) == have.get(name), param, shown, f"could not be read (its header does not match its "
              f"tensors: {name!r} is {_shape(want.get(name))} by the header, {_shape(have.get(name))} in the file)")
    module = build()
    module.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return module


def _shape(shape: tuple[int, ...] | None) -> str:
    return "absent" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


def resolve_weights(path: str | Path | None, default: Path, what: str, train_command: str) -> Path:
    """The weights file given, else the shipped `default`; one line naming `draft` when there is none."""
    path = Path(path) if path is not None else default
    if not path.is_file():
        raise ConfigError("draft", shown_path(path), f"has no {what} weights file: train one with `{train_command}`")
    return path


def trained_for(meta: dict, target_name: str) -> str:
    """' (trained for X)' when the file's metadata names another target than `target_name`, else ''. X is the
    last part of the name recorded (a model id's or a folder's own name), never a path on the machine that
    trained it: the name goes into traces and onto the page."""
    trained = meta.get("target") if isinstance(meta, dict) else None
    if not isinstance(trained, str) or not trained.strip() or trained == target_name:
        return ""
    name = Path(trained.replace("\\", "/").rstrip("/")).name or "another model"
    return f" (trained for {name[:60]})"
