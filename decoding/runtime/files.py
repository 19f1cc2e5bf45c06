"""Writing the files a user keeps (traces, drafter weights and their cards, cached cost tables, GEMM plans,
distillation data): atomically, a temporary file beside the target renamed over it, so that a reader
never sees half a file and a failed write (a full disk, Ctrl-C) leaves the file that was there as it was;
and checking, before any work, that a file given on the command line can be written."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

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
    tmp = path.with_name(f".{_prefix(path.name)}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        _flush(tmp)
        if path.is_file():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _prefix(name: str, limit: int = 120) -> str:
    """The first `limit` bytes of `name` (whole characters), so that the temporary name stays within the
    file-name limit for every name that is within it."""
    return name.encode("utf-8", "surrogateescape")[:limit].decode("utf-8", "ignore")


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


T = TypeVar("T")


class CacheWarning(UserWarning):
    """The cache folder cannot be written: everything still works, only slower to start."""


_cache_warned = threading.Event()


def save_to_cache(save: Callable[[Path], None], path: Path) -> bool:
    """`save(path)` (an atomic writer) into the cache, its folder made first. When the cache cannot be
    written (read-only, full, not a folder), warn once per process (CacheWarning) and return False: the
    caller goes on without the cached copy."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save(path)
    except OSError as err:
        if not _cache_warned.is_set():
            _cache_warned.set()
            warnings.warn(f"the cache folder {path.parent} cannot be written ({err.strerror or err}); working without "
                          "it (set DECODESCOPE_CACHE to a writable folder)", CacheWarning, stacklevel=2)
        return False
    return True


def keep_recent(entries: Iterable[Path], keep: int) -> None:
    """Remove all but the `keep` most recently modified of `entries` (files or folders of a cache: the least
    recently used go first where a use touches its entry); one another process removed meanwhile counts as
    the oldest, and one that cannot be removed stays."""
    def used(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except OSError:
            return 0.0

    for old in sorted(entries, key=used, reverse=True)[keep:]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def touch(path: Path) -> None:
    """Mark a cache entry as just used (keep_recent), where the cache can be written."""
    try:
        os.utime(path)
    except OSError:
        pass


def load_from_cache(load: Callable[[Path], T], path: Path) -> T | None:
    """`load(path)` of a cache file; None when there is none or it cannot be read (a half-written or damaged
    file, one from an older version): the caller makes it again."""
    if not path.is_file():
        return None
    try:
        return load(path)
    except Exception:  # noqa: BLE001 - whatever is wrong with a cache file, making it again mends it
        return None


def check_writable(path: str | Path, param: str) -> Path:
    """`path` as a file this process can create or replace, checked before any work is done (its directory
    exists, it is not a directory nor read-only, a file can be created beside it); else ConfigError naming
    `param`."""
    text = str(path)
    check(text.strip() != "", param, text, "give a file path")
    target = Path(text).expanduser()
    check_name_lengths(target, param, text)
    folder = Path(os.path.realpath(target)).parent       # where atomic_path puts its temporary file
    check(folder.exists(), param, text, f"its directory {folder} does not exist")
    check(folder.is_dir(), param, text, f"{folder} is not a directory")
    check(not target.is_dir(), param, text, "is a directory; give a file path")
    check(not target.exists() or os.access(target, os.W_OK), param, text, "is read-only")
    if target.exists() and not target.is_file():        # a device or a pipe (/dev/stdout): written in place
        return target
    _probe(folder, param, text)
    return target


def check_folder(path: str | Path, param: str) -> Path:
    """`path` as a folder (made when missing) in which files can be created, checked before any work;
    else ConfigError naming `param`."""
    text = str(path)
    check(text.strip() != "", param, text, "give a folder")
    folder = Path(text).expanduser()
    check_name_lengths(folder, param, text)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(param, text, f"could not be made a folder ({err.strerror or err})") from None
    _probe(folder, param, text)
    return folder


def _probe(folder: Path, param: str, text: str) -> None:
    """A file can be created in `folder` (created and removed again); else ConfigError naming `param`."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.")
    except OSError as err:
        raise ConfigError(param, text, f"no file can be created in {folder} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)


def check_name_lengths(target: Path, param: str, text: str) -> None:
    """Every part of `target` within the system's limit on a file name (255 bytes on most), the whole
    path within its limit on a path; else ConfigError naming `param`."""
    name_max, path_max = _limits(target)
    for part in target.parts:
        size = len(os.fsencode(part))
        what = "its file name" if part == target.name else f"the folder name {_short(part)!r}"
        check(size <= name_max, param, _short(text), f"{what} is {size} bytes long; the limit here is {name_max}")
    size = len(os.fsencode(str(target)))
    check(size < path_max, param, _short(text), f"the path is {size} bytes long; the limit here is {path_max - 1}")


def _limits(target: Path) -> tuple[int, int]:
    """(longest file name, longest path) in bytes on the file system `target` would be on."""
    folder = next((p for p in target.parents if _is_dir(p)), Path("."))
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):          # no pathconf (Windows): the usual limits
        return 255, 4096


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:                 # a part of it too long, a loop of links
        return False


def _short(text: str, keep: int = 60) -> str:
    """`text` cut to `keep` characters with '...' in the middle, for messages about over-long names."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-(keep // 2 - 3):]}"
