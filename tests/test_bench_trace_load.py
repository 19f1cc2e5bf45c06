"""bench/trace_load.py builds its large traces from the tour traces so that they still load (every index
renumbered, DSpark's prefill once) and reports one row per strategy."""
from __future__ import annotations

import json

from bench import trace_load
from decoding.core.trace import from_json


def test_grown_traces_load_and_keep_their_strategy():
    for name in trace_load.SOURCES:
        small = json.loads((trace_load.TOUR / f"{name}.json").read_text(encoding="utf-8"))
        trace = from_json(trace_load.grown(name, 0.5))
        assert trace.strategy == small["strategy"] and len(trace.steps) > len(small["steps"])
        assert [s.index for s in trace.steps] == list(range(len(trace.steps)))


def test_the_section_has_a_row_per_trace(monkeypatch):
    written = {}
    monkeypatch.setattr(trace_load, "write_section", lambda name, body: written.update({name: body}))
    trace_load.main(["--mib", "0.2", "--repeats", "1"])
    rows = [line for line in written["trace_load"].splitlines() if line.startswith("| ") and "MiB" not in line]
    assert [r.split("|")[1].strip() for r in rows] == list(trace_load.SOURCES)
