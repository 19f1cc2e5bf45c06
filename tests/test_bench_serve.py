"""`python -m bench serve`'s parts without a server: the seeded plan of requests, the fixed texts to summarise,
the count of answers that differ from greedy's, and its flags' one-line refusals. (Its clients against a live
server: tests/test_serve.py.)"""
from __future__ import annotations

import dataclasses

import pytest

from bench import serve as bench_serve


def test_the_plan_deals_every_request_once_and_is_seeded():
    names = ["a", "b", "c"]
    work = bench_serve.plan(10, 4, names, think_s=0.5, seed=3)
    dealt = [name for share in work for name, _ in share]
    assert len(work) == 4 and sorted(dealt) == sorted(names[i % 3] for i in range(10))
    assert work == bench_serve.plan(10, 4, names, think_s=0.5, seed=3)
    assert work != bench_serve.plan(10, 4, names, think_s=0.5, seed=4)
    assert all(think == 0.0 for share in bench_serve.plan(6, 2, names, 0.0, 1) for _, think in share)


def test_the_texts_to_summarise_are_fixed_and_long():
    texts = bench_serve.prompts()
    assert texts == bench_serve.prompts()
    words = [len(texts[f"summary-{n}"].split()) for n in (500, 750, 1000)]
    assert 350 < words[0] < words[1] < words[2] < 900, words


def _result(strategy: str, prompt: str, text: str, error: str | None = None) -> bench_serve.Result:
    return bench_serve.Result(strategy, 1, prompt, 0.1, (0.01,), 0.5, 0.0, 3, text, error)


def test_answers_that_differ_from_greedys_are_counted():
    same = [_result("greedy", "p", "x"), _result("dspark", "p", "x"), _result("speculative", "q", "y")]
    assert bench_serve.differing(same) == 0
    assert bench_serve.differing([*same, _result("dspark", "p", "other")]) == 1
    assert bench_serve.differing([*same, _result("dspark", "p", "", error="timeout")]) == 0


def test_a_row_reads_percentiles_in_seconds_and_milliseconds():
    results = [dataclasses.replace(_result("greedy", "p", "x"), e2e_s=float(i)) for i in range(1, 11)]
    row = bench_serve.row(results, "greedy", 1, wall_s=10.0)
    assert row.startswith("| greedy | 1 | 10 | 0 | 0.10 / 0.10 / 0.10 | 10.00 / 10.00 | 5.50 / 9.10 / 9.91 |")


@pytest.mark.parametrize("argv, line", [
    (["--concurrency", "0"], "--concurrency must each be between 1 and 16, got '0'"),
    (["--concurrency", "a"], "--concurrency must be numbers separated by commas, got 'a'"),
    (["--strategies", "fast"], "--strategies must be names from greedy, sample, beam, speculative, dspark, got 'fast'"),
    (["--requests", "500"], "--requests must be between 1 and 200, got 500"),
    (["--think", "-1"], "--think must be between 0 and 60 seconds, got -1.0"),
])
def test_a_bad_flag_is_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_serve.checked(argv)
    assert line in (str(exit_info.value.code) + capsys.readouterr().err)


def test_the_table_says_when_the_machine_was_busy():
    import argparse
    import os

    args = argparse.Namespace(strategies=("greedy",), concurrency=(1,), think=0.0, max_tokens=8)
    results, walls = [_result("greedy", "p", "x")], {("greedy", 1): 1.0}
    cores = os.cpu_count() or 1
    busy = bench_serve.render(results, walls, args, "cmd", ((cores + 1.0,) * 3, (0.1,) * 3))
    idle = bench_serve.render(results, walls, args, "cmd", ((0.1,) * 3, (0.1,) * 3))
    its_own = bench_serve.render(results, walls, args, "cmd", ((0.1,) * 3, (cores + 1.0,) * 3))
    assert bench_serve.BUSY in busy and bench_serve.BUSY not in idle
    assert bench_serve.BUSY not in its_own, "the load after includes the benchmark's own server and clients"
    assert "| greedy | 1 | 1 | 0 |" in idle


def test_the_servers_memory_is_read_from_proc():
    import os

    mine = bench_serve.resident_mib(os.getpid())
    assert mine is None or mine > 10
    assert bench_serve.memory_line([100.4, 130.6]).endswith("100 MiB once started, 131 MiB after the last request "
                                                            "(the request log is on disk).")
    assert bench_serve.memory_line([None, 3.0]) == ""


def test_the_lesson_sets_one_requests_speedup_beside_the_tail_at_4_clients():
    import argparse

    def timed(strategy: str, clients: int, e2e: list[float]) -> list[bench_serve.Result]:
        return [dataclasses.replace(_result(strategy, "p", "x"), concurrency=clients, e2e_s=s) for s in e2e]

    results = (timed("greedy", 1, [2.0, 2.0, 2.0]) + timed("dspark", 1, [1.0, 1.0, 1.0])
               + timed("greedy", 4, [8.0, 8.0, 9.0]) + timed("dspark", 4, [3.0, 3.0, 3.0]))
    args = argparse.Namespace(strategies=("greedy", "dspark"), concurrency=(1, 4))
    lines = bench_serve.lesson_lines(results, args)
    assert ("- dspark: 2.00× greedy's speed on one request (end-to-end P50 at 1 client 1.00 s against 2.00 s); "
            "at 4 clients its P99 end to end is 3.00 s against greedy's 8.98 s (2.99× lower).") in lines
    assert not any(line.startswith("- greedy") for line in lines)
    assert bench_serve.lesson_lines(results, argparse.Namespace(strategies=("greedy", "dspark"),
                                                                concurrency=(1, 8))) == []
