"""`python -m bench serve-soak`'s parts without a server: the tally that counts a differing answer as a lost
or mixed-up response, the table it writes, and its flags' one-line refusals. (The soak itself is a benchmark:
its figures are in BENCHMARKS.md.)"""
from __future__ import annotations

import argparse

import pytest

from bench import serve_soak
from bench.serve import Result


def _result(strategy: str, prompt: str, text: str, error: str | None = None) -> Result:
    return Result(strategy, 16, prompt, 0.1, (0.01,), 0.5, 0.0, 3, text, error)


def test_an_answer_unlike_greedys_is_counted_and_a_failure_is_not_a_mismatch():
    tally = serve_soak.Tally()
    tally.add(_result("dspark", "gears", "same"), expected="same")
    tally.add(_result("speculative", "gears", "other"), expected="same")
    tally.add(_result("greedy", "gears", "", error="APITimeoutError: timed out"), expected="same")
    assert tally.mismatched == ["speculative on gears"] and len(tally.results) == 3


def test_the_table_counts_requests_failures_and_memory_growth():
    tally = serve_soak.Tally()
    for strategy, text in (("greedy", "a"), ("dspark", "a"), ("dspark", "b")):
        tally.add(_result(strategy, "p", text), expected="a")
    args = argparse.Namespace(clients=16, minutes=10.0, max_tokens=32, log_count=100,
                              strategies=("greedy", "dspark"))
    body = serve_soak.render(tally, [1700.0, 1750.0, 1760.0, 1755.0], (100, 12.5), args, "cmd")
    assert ("| 3 | greedy 1, dspark 2 | 0 | 1 | 1700 / 1760 / 1755 | +10 MiB | 100 traces, 12.5 MiB (bound 100 "
            "traces) |") in body
    assert "Differing answers: dspark on p." in body


@pytest.mark.parametrize("argv, line", [
    (["--clients", "17"], "--clients must be between 1 and 16, got '17'"),
    (["--clients", "4,8"], "--clients must be one number"),
    (["--minutes", "0"], "--minutes must be between 0.1 and 60 minutes, got 0.0"),
    (["--max-tokens", "0"], "--max-tokens must be between 1 and 1024, got 0"),
    (["--log-count", "0"], "--log-count must be between 1 and 100000, got 0"),
    (["--every", "0.5"], "--every must be between 1 and 600 seconds, got 0.5"),
])
def test_a_bad_flag_is_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_soak.checked(argv)
    assert line in (str(exit_info.value.code) + capsys.readouterr().err)


def test_the_table_says_when_the_machine_was_busy_before_the_soak():
    import os

    args = argparse.Namespace(clients=1, minutes=1.0, max_tokens=8, log_count=10, strategies=("greedy",))
    tally, cores = serve_soak.Tally(), os.cpu_count() or 1
    tally.add(_result("greedy", "p", "a"), expected="a")
    busy = serve_soak.render(tally, [1.0, 1.0], (1, 0.1), args, "cmd", ((cores + 1.0,), (0.1,)))
    its_own = serve_soak.render(tally, [1.0, 1.0], (1, 0.1), args, "cmd", ((0.1,), (cores + 1.0,)))
    assert serve_soak.BUSY in busy and serve_soak.BUSY not in its_own
