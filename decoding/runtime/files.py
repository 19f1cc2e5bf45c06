"""Writing the files a user keeps (traces, drafter weights and their cards, cached cost tables, GEMM plans,
distillation data): atomically, a temporary file beside the target renamed over it, so that a reader
never sees half a file and a failed write (a full disk, Ctrl-C) leaves the file that was there as it was;
and checking, before any work, that a file given on the command line can be written."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from decoding.core.errors import ConfigError, check


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` for the caller to write; when the block ends without an error, the
    file is flushed to disk and renamed over `path` in one step (os.replace; an existing file's mode is
    kept; a symbolic link is written through). On any error, KeyboardInterrupt included, the temporary
    file is removed, `path` is left as it was, and the error is raised. An existing `path` that is not a
    regular file (a device or a pipe, such as /dev/stdout) is handed out itself: written in place."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        yield path
        return
    tmp = path.with_name(f".{path.name[:180]}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        _flush(tmp)
        if path.is_file():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _flush(path: Path) -> None:
    """Push the file's data to the disk (a full disk can first show here)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` as UTF-8 into `path`, atomically (atomic_path)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def check_writable(path: str | Path, param: str) -> Path:
    """`path` as a file this process can create or replace, checked before any work is done (its directory
    exists, it is not a directory nor read-only, a file can be created beside it); else ConfigError naming
    `param`."""
    text = str(path)
    check(text.strip() != "", param, text, "give a file path")
    target = Path(text).expanduser()
    folder = Path(os.path.realpath(target)).parent       # where atomic_path puts its temporary file
    check(folder.exists(), param, text, f"its directory {folder} does not exist")
    check(folder.is_dir(), param, text, f"{folder} is not a directory")
    check(not target.is_dir(), param, text, "is a directory; give a file path")
    check(not target.exists() or os.access(target, os.W_OK), param, text, "is read-only")
    if target.exists() and not target.is_file():        # a device or a pipe (/dev/stdout): written in place
        return target
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.")
    except OSError as err:
        raise ConfigError(param, text, f"no file can be created in {folder} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)
    return target
