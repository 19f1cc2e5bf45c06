"""Record the tour's traces (assets/tour/) on the embedded model: the stops are ui/views/tour.py's.

    python -m bench.tour record                 # every stop, on the embedded model
    python -m bench.tour record --only dspark   # one stop (repeat --only for more)
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from decoding.core.errors import ConfigError, check
from decoding.core.trace import Trace, to_json
from decoding.runner import run
from decoding.runtime import models
from decoding.runtime.files import check_folder
from decoding.runtime.paths import TOUR_DIR
from ui.views.tour import MAX_SHIPPED_BYTES, MODEL, STOPS, Stop, stop_by_id, stop_ids, trace_path


def record_stop(lm, stop: Stop) -> Trace:
    return run(lm, lm.encode(stop.prompt, chat_template=True), stop.config(), prompt_text=stop.prompt)


def record(stops: Sequence[Stop], root: Path, *, device: str = "auto", dtype: str = "auto",
           out=None) -> int:
    """Record each stop on the embedded model and write its trace; returns the number of failures
    (a run refused before its first step or ending with an error is reported and not written)."""
    out = sys.stdout if out is None else out
    lm = models.load(models.ModelSpec(MODEL, device=device, dtype=dtype))
    root.mkdir(parents=True, exist_ok=True)
    failures = 0
    for stop in stops:
        try:
            trace = record_stop(lm, stop)
            error = trace.error
        except ConfigError as err:              # refused before its first step (e.g. a drafter for another model)
            error = str(err)
        if error:
            print(f"{stop.id}: not recorded: {error}", file=out)
            failures += 1
            continue
        text = to_json(trace)
        trace_path(stop, root).write_text(text, encoding="utf-8")
        size = len(text.encode("utf-8"))
        note = f"  (over {MAX_SHIPPED_BYTES} bytes: lower top_n)" if size > MAX_SHIPPED_BYTES else ""
        print(f"{stop.id}: {trace.stats.new_tokens} tokens, {size} bytes -> {trace_path(stop, root)}{note}",
              file=out)
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tour", description="Record the tour's traces.")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run each stop on the embedded model and write assets/tour/<stop>.json")
    rec.add_argument("--only", action="append", default=None, metavar="STOP",
                     help=f"record only this stop (repeatable): {', '.join(stop_ids())}")
    rec.add_argument("--out", type=Path, default=TOUR_DIR, help="folder for the traces")
    rec.add_argument("--device", default="auto")
    rec.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    try:
        stops = [stop_by_id(s) for s in args.only] if args.only else list(STOPS)
        check(bool(stops), "only", args.only, "name at least one stop")
        root = check_folder(args.out, "out")       # before the model loads: a bad folder is one line
        return 1 if record(stops, root, device=args.device, dtype=args.dtype) else 0
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
