"""bench/memory.py: the peak memory of a block, and the benchmark tables' peak columns.

CPU: a tensor of known size allocated and freed inside the block raises the sampled peak by about its
size, and so does a mapping unmapped inside it (the resident size at the end is back near the start:
only the sampling saw it); with
nothing allocated the peak stays small. CUDA: the bookkeeping against stand-ins for torch.cuda's
counters, and for real where a GPU is present."""
from __future__ import annotations

import argparse
import mmap
import time
import types
from contextlib import contextmanager

import pytest
import torch

from bench import dspark, engine, interleave, memory, model_options, speculative
from bench.memory import MIB, Peak, mib_cell, peak_memory, resident_bytes

SIZE = 96 * MIB
WAIT_S = 30.0             # the sampler runs at the lowest priority on a busy machine: wait for samples


def wait_for_samples(mem: Peak, more: int) -> None:
    """Hold on until the sampler has taken `more` samples beyond those it has now."""
    target, deadline = mem.samples + more, time.monotonic() + WAIT_S
    while mem.samples < target and time.monotonic() < deadline:
        time.sleep(0.002)
    assert mem.samples >= target, "the sampler took no samples"


needs_proc = pytest.mark.skipif(resident_bytes() is None, reason="no /proc/self/statm here")


@needs_proc
def test_cpu_peak_sees_a_tensor_freed_inside_the_block():
    with peak_memory("cpu", interval_s=0.001) as mem:
        block = torch.ones(SIZE // 4, dtype=torch.float32)          # written, so resident
        wait_for_samples(mem, 3)
        del block
    assert 0.9 * SIZE <= mem.above <= 1.25 * SIZE, mem.above / MIB
    assert mem.above_mib == pytest.approx(mem.above / MIB)


@needs_proc
def test_cpu_peak_sees_memory_gone_by_the_end_of_the_block():
    """A before/after reading would miss this block: its memory is handed back to the system inside it.
    (An anonymous mapping, unmapped on close: whether a freed tensor's pages go back to the system is the
    C allocator's choice, which differs between machines.)"""
    with peak_memory("cpu", interval_s=0.001) as mem:
        mapping = mmap.mmap(-1, SIZE)
        torch.frombuffer(mapping, dtype=torch.uint8).fill_(1)        # every page written, so resident
        wait_for_samples(mem, 3)
        mapping.close()
    end = resident_bytes()
    assert 0.9 * SIZE <= mem.above <= 1.25 * SIZE, mem.above / MIB
    assert end - mem.baseline < SIZE / 4, (end - mem.baseline) / MIB


@needs_proc
def test_cpu_peak_with_nothing_allocated_is_small():
    with peak_memory("cpu", interval_s=0.001) as mem:
        wait_for_samples(mem, 5)
    assert mem.above < 8 * MIB, mem.above / MIB


def test_cuda_peak_is_max_allocated_less_the_start(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        synchronize=lambda d: calls.append(("sync", str(d))),
        reset_peak_memory_stats=lambda d: calls.append(("reset", str(d))),
        memory_allocated=lambda d: 500 * MIB,
        max_memory_allocated=lambda d: 740 * MIB)
    monkeypatch.setattr(memory.torch, "cuda", fake)
    with peak_memory(torch.device("cuda", 1)) as mem:
        calls.append(("block", ""))
    assert calls == [("sync", "cuda:1"), ("reset", "cuda:1"), ("block", ""), ("sync", "cuda:1")]
    assert (mem.baseline, mem.peak, mem.above_mib, mem.device) == (500 * MIB, 740 * MIB, 240.0, "cuda:1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_peak_sees_a_tensor_on_the_gpu():
    device = torch.device("cuda")
    with peak_memory(device) as mem:
        block = torch.ones(SIZE // 4, dtype=torch.float32, device=device)
        del block
    assert 0.99 * SIZE <= mem.above <= 1.05 * SIZE
    with peak_memory(device) as idle:
        pass
    assert idle.above < MIB


def test_mib_cell_is_the_largest_measured_peak():
    assert mib_cell([1.25, None, 3.04]) == "3.0" and mib_cell([None]) == "—" and mib_cell([]) == "—"


# ------------------------------------------------------------------ the tables' peak columns

@contextmanager
def fake_peaks(values):
    """A stand-in for peak_memory yielding the next of `values` (MiB) per block."""
    it = iter(values)

    @contextmanager
    def fake(device=None, interval_s=None):
        mib = next(it)
        yield Peak(device="cpu", baseline=0, peak=int(mib * MIB))
    yield fake


def fake_lm():
    return types.SimpleNamespace(device=torch.device("cpu"), encode=lambda text: [1, 2, 3],
                                 model=types.SimpleNamespace(generation_config=types.SimpleNamespace()))


def test_engine_table_has_a_peak_per_contender(monkeypatch):
    monkeypatch.setattr(engine, "PROMPTS", {"a": "x"})
    monkeypatch.setattr(engine, "_ours", lambda lm, ids, n, mode, seed: ([5, 6, 7, 8], 1.0))
    theirs = {"greedy": [5, 6, 7, 8], "sample": [1, 1, 1, 1], "beam": [5, 6, 7, 9]}
    monkeypatch.setattr(engine, "_generate", lambda lm, ids, n, mode, seed: (theirs[mode], 2.0))
    with fake_peaks([10, 20, 30, 40, 50, 60]) as fake:       # rep 0: greedy ours, generate; sample ...; beam ...
        monkeypatch.setattr(engine, "peak_memory", fake)
        rates = engine.measure(fake_lm(), repeats=1, max_new=4)
    assert rates["greedy"]["peak_ours"] == [10] and rates["greedy"]["peak_generate"] == [20]
    assert rates["sample"]["peak_ours"] == [30] and rates["sample"]["peak_generate"] == [40]
    assert rates["beam"]["peak_ours"] == [50] and rates["beam"]["peak_generate"] == [60]
    assert rates["greedy"]["same"] == [True] and rates["beam"]["same"] == [False] and rates["sample"]["same"] == []
    table = engine.render(rates, 1, 4, "m")
    assert "| same output | ours peak MiB | generate peak MiB |" in table and "| yes | 10.0 | 20.0 |" in table
    assert "| — | 30.0 | 40.0 |" in table and "| no | 50.0 | 60.0 |" in table
    assert "Peak MiB" in table


def test_engine_agreement_allows_generate_forced_past_our_eos():
    eos = frozenset({2})
    assert engine.agrees([5, 6, 2], [5, 6, 7, 8], "greedy", eos)        # generate went on past EOS
    assert not engine.agrees([5, 6, 2], [5, 9, 7, 8], "greedy", eos)    # a real divergence before it
    assert not engine.agrees([5, 6, 7], [5, 6, 8], "greedy", eos)
    assert not engine.agrees([5, 6, 2], [5, 6, 7], "beam", eos)         # beam runs the same search: all of it


def test_engine_same_cell_counts_partial_agreement():
    assert engine.same_cell([True, False, True]) == "2 of 3"
    assert engine.same_cell([]) == "—" and engine.same_cell([True]) == "yes" and engine.same_cell([False]) == "no"


@pytest.mark.parametrize("bench", [speculative, dspark])
def test_contender_tables_have_a_peak_column(bench, monkeypatch):
    stats = types.SimpleNamespace(mean_accepted_length=None, acceptance_rate=None)
    trace = types.SimpleNamespace(stats=stats, steps=[])
    result = (4, 1.0, stats if bench is speculative else trace)
    runs = {"greedy (ours)": lambda ids: result, "other": lambda ids: result}
    monkeypatch.setattr(bench, "PROMPTS", {"a": "x"})
    monkeypatch.setattr(bench, "contenders", lambda *a: runs)
    shared = argparse.ArgumentParser()
    model_options.add(shared)                                       # --device, --dtype, ... at their defaults
    args = types.SimpleNamespace(repeats=2, gammas=[4], budget=4, max_new_tokens=4, gamma=5, draft_layers=4, lookup=2,
                                 **vars(shared.parse_args([])))
    with fake_peaks([5, 7, 9, 3]) as fake:                            # rep 0 in order, rep 1 reversed
        monkeypatch.setattr(interleave, "peak_memory", fake)       # both benches time through interleave
        rows = bench.measure(fake_lm(), fake_lm(), args)      # (lm, draft or drafter, args)
    assert rows["greedy (ours)"]["peak"] == [5, 3] and rows["other"]["peak"] == [7, 9]
    table = bench.render(rows, args) if bench is dspark else bench.render(rows, args, "m")
    assert "peak MiB |" in table.splitlines()[-4]
    assert table.splitlines()[-2].startswith("| greedy (ours) |") and "| 5.0 |" in table.splitlines()[-2]
    assert "| 9.0 |" in table.splitlines()[-1]


def test_write_section_refreshes_the_header_that_explains_peak_memory(tmp_path, monkeypatch):
    from bench import report

    monkeypatch.setattr(report, "REPORT", tmp_path / "BENCHMARKS.md")
    report.REPORT.write_text("# old title\n\nold words\n\n<!-- bench:a -->\nA\n<!-- /bench:a -->\n")
    report.write_section("b", "B")
    text = report.REPORT.read_text()
    assert text.startswith(report.HEADER) and "old words" not in text
    assert "<!-- bench:a -->\nA\n<!-- /bench:a -->" in text and "<!-- bench:b -->\nB\n<!-- /bench:b -->" in text
    assert "max_memory_allocated" in report.HEADER and "/proc/self/statm" in report.HEADER
