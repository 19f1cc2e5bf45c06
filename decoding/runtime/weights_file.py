"""Drafter weights files (safetensors): float tensors stored as float16, a string header with the format
name and metadata; reading checks the format first, so a wrong file is a one-line `draft` error, and
any damage found while reading one (`reading`) is one line naming the file."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

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


def resolve_weights(path: str | Path | None, default: Path, what: str, train_command: str) -> Path:
    """The weights file given, else the shipped `default`; one line naming `draft` when there is none."""
    path = Path(path) if path is not None else default
    if not path.is_file():
        raise ConfigError("draft", shown_path(path), f"has no {what} weights file: train one with `{train_command}`")
    return path


def trained_for(meta: dict, target_name: str) -> str:
    """' (trained for X)' when the file's metadata names another target than `target_name`, else ''."""
    trained = meta.get("target")
    return f" (trained for {trained})" if trained and trained != target_name else ""
