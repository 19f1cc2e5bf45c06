"""ui/views/memory.py on tiny runs: the table follows the trace's kv records, the chart draws one line per
lane (beam search's B-fold cache above greedy's) and peaks only where rounds rolled back, and a trace
without records (schema before 1.3) draws nothing and says why."""
from __future__ import annotations

import dataclasses
from itertools import accumulate

import pytest
from dspark_helpers import one_thread, varied_llama

from decoding.core.config import BeamConfig, GreedyConfig, SpeculativeConfig
from decoding.runner import run
from ui.views import memory

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
PROMPT = [9, 40, 17, 9, 40, 17, 9, 40]


@pytest.fixture(scope="module")
def traces():
    lm = varied_llama(seed=0)
    return {"greedy": run(lm, PROMPT, GreedyConfig(max_new_tokens=6)),
            "beam 3": run(lm, PROMPT, BeamConfig(max_new_tokens=6, num_beams=3)),
            "lookup": run(lm, PROMPT, SpeculativeConfig(draft="lookup", gamma=4, max_new_tokens=16))}


def test_table_follows_the_records(traces):
    table = memory.memory_table(traces["lookup"].steps)
    steps = traces["lookup"].steps
    assert list(table["held_mb"]) == [s.kv.bytes / 1e6 for s in steps]
    assert list(table["freed_mb"]) == [s.kv.freed_bytes / 1e6 for s in steps]
    assert list(table["tokens_emitted"]) == list(accumulate(len(s.emitted) for s in steps))


def test_chart_one_line_per_lane_and_peaks_where_rolled_back(traces):
    fig = memory.memory_figure({k: t.steps for k, t in traces.items()})
    names = [t.name for t in fig.data]
    assert names == ["greedy", "beam 3", "lookup", "lookup: peak in verification"]
    greedy, beam = fig.data[0], fig.data[1]
    assert list(beam.y[:3]) == pytest.approx([3 * y for y in greedy.y[:3]])


def test_a_trace_without_records(traces):
    old = [dataclasses.replace(s, kv=None) for s in traces["greedy"].steps]
    assert memory.memory_table(old).empty and memory.memory_figure({"old": old}) is None
    assert "schema 1.3" in memory.memory_summary(old)


def test_summary_names_the_end_and_the_rollbacks(traces):
    steps = traces["lookup"].steps
    text = memory.memory_summary(steps)
    freed = sum(s.kv.freed_bytes for s in steps)
    assert f"freed {memory.human_bytes(freed)} over" in text and "1 sequence)" in text
    assert "3 sequences" in memory.memory_summary(traces["beam 3"].steps)


def test_human_bytes():
    assert [memory.human_bytes(n) for n in (512, 1536, 3_320_000, 2.5e9)] == ["512 B", "1.5 kB", "3.32 MB", "2.50 GB"]
