"""Drafter weights files (safetensors): float tensors stored as float16, a string header with the format
name and metadata; reading checks the format first, so a wrong file is a one-line `draft` error."""
from __future__ import annotations

from pathlib import Path

import torch

from decoding.core.errors import ConfigError, check


def save_weights(state: dict[str, torch.Tensor], path: str | Path, header: dict[str, str]) -> None:
    from safetensors.torch import save_file

    stored = {k: (v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()).contiguous()
              for k, v in state.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(path), metadata=header)


def read_header(path: str | Path, weights_format: str, what: str) -> dict[str, str]:
    """The file's header, after checking that it is a `weights_format` file (else: draft=PATH is not a
    `what` weights file)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        header = f.metadata() or {}
    check(header.get("format") == weights_format, "draft", str(path),
          f"is not a {what} weights file (format {header.get('format')!r})")
    return header


def resolve_weights(path: str | Path | None, default: Path, what: str, train_command: str) -> Path:
    """The weights file given, else the shipped `default`; one line naming `draft` when there is none."""
    path = Path(path) if path is not None else default
    if not path.is_file():
        raise ConfigError("draft", str(path), f"has no {what} weights file: train one with `{train_command}`")
    return path


def trained_for(meta: dict, target_name: str) -> str:
    """' (trained for X)' when the file's metadata names another target than `target_name`, else ''."""
    trained = meta.get("target")
    return f" (trained for {trained})" if trained and trained != target_name else ""
