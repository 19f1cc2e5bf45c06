"""Every served request's record on disk: its timing and its whole trace, one JSON file per request
under the cache folder, bounded in count and bytes (the oldest dropped first). File names begin with the
time of writing in nanoseconds, so that their order is the order the requests ended."""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from decoding.core.errors import check
from decoding.runtime.files import write_text_atomic
from decoding.runtime.paths import cache_dir, safe_name

SUFFIX = ".json"


def default_folder() -> Path:
    return cache_dir("serve/requests")


@dataclass(frozen=True)
class Bounds:
    max_count: int
    max_bytes: int

    def __post_init__(self):
        check(isinstance(self.max_count, int) and self.max_count >= 1, "log_count", self.max_count,
              "must be an integer >= 1")
        check(isinstance(self.max_bytes, int) and self.max_bytes >= 1, "log_mb", self.max_bytes / 1e6,
              "must be > 0")


class TraceLog:
    def __init__(self, folder: Path, bounds: Bounds):
        self.folder, self.bounds = Path(folder), bounds
        self._lock = threading.Lock()
        self._last_ns = 0

    def add(self, request_id: str, record: dict) -> Path:
        """Write `record` as the newest file, then drop the oldest until the folder is within its bounds."""
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{self._stamp():020d}-{safe_name(request_id)}{SUFFIX}"
            write_text_atomic(path, json.dumps(record, ensure_ascii=False))
            self._prune()
            return path

    def _stamp(self) -> int:
        """Now in nanoseconds, strictly after the last stamp (two writes in one clock tick keep their order)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def files(self) -> list[Path]:
        """The records, oldest first."""
        return sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []

    def _prune(self) -> None:
        files = self.files()
        sizes = [f.stat().st_size for f in files]
        total = sum(sizes)
        while files and (len(files) > self.bounds.max_count or total > self.bounds.max_bytes):
            files.pop(0).unlink(missing_ok=True)
            total -= sizes.pop(0)


# Read back for GET /v1/decodescope/requests: the newest records' timing (their traces left out), and one
# record whole by its request id. Ids are checked against what the server makes, so none names a path.
ID_PATTERN = re.compile(r"(?:cmpl|chatcmpl)-[0-9a-f]{1,64}")
MAX_LISTED = 1000
SUMMARY_FIELDS = ("id", "model", "strategy", "finish_reason", "prompt_tokens", "completion_tokens",
                  "arrived_unix_s", "timing")


def summaries(log: TraceLog, limit: int = MAX_LISTED) -> list[dict]:
    """The newest `limit` records, oldest first, without their traces (an unreadable file is skipped)."""
    out = []
    for path in log.files()[-limit:]:
        record = _read(path)
        if record is not None:
            out.append({k: record.get(k) for k in SUMMARY_FIELDS} | {"rounds": rounds(record.get("trace"))})
    return out


def find(log: TraceLog, request_id: str) -> dict | None:
    """The record of `request_id` whole; None for an id the server could not have made, or one not kept."""
    if not ID_PATTERN.fullmatch(request_id):
        return None
    hits = [p for p in log.files() if p.name.endswith(f"-{request_id}{SUFFIX}")]
    return _read(hits[-1]) if hits else None


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def rounds(trace) -> list[list]:
    """[drafted, accepted] per drafting round of a trace as JSON (unchecked: readers check), so that a listing
    without traces still shows acceptance."""
    steps = trace.get("steps", []) if isinstance(trace, dict) else []
    out = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        if step.get("kind") == "spec_round":
            out.append([step.get("gamma"), step.get("accepted")])
        elif step.get("kind") == "dspark_round" and not step.get("prefill"):
            out.append([_count(step.get("nodes")), _count(step.get("accepted_path"))])
    return out


def _count(value) -> int | None:
    return len(value) if isinstance(value, list) else None
