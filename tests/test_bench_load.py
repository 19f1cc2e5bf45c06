"""Pure helpers of the many-sessions benchmark (bench/load.py): percentiles, the --sessions list, the table."""
import os
from pathlib import Path

import pytest

from bench.load import main, parse_sessions, percentile, render


def test_percentile_interpolates_between_ranks():
    assert percentile([10.0], 95) == 10.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 100) == 5.0
    assert percentile(list(map(float, range(1, 101))), 95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        percentile([], 50)


@pytest.mark.parametrize("text", ["", "0", "1,17", "4,x", "1;4", "-1"])
def test_parse_sessions_refuses_what_it_cannot_run(text):
    with pytest.raises(ValueError, match="--sessions"):
        parse_sessions(text)


def test_parse_sessions_reads_a_list():
    assert parse_sessions("1,4,8") == (1, 4, 8)
    assert parse_sessions("16") == (16,)


@pytest.mark.parametrize("argv, message", [(["--sessions", "0"], "--sessions"), (["--steps", "0"], "--steps"),
                                           (["--steps", "51"], "--steps")])
def test_main_refuses_bad_flags_in_one_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_render_compares_every_scenario_with_one_session():
    one = [{"click_to_chip_ms": 300.0, "server_ms": 100.0}, {"click_to_chip_ms": 320.0, "server_ms": 120.0}]
    eight = [{"click_to_chip_ms": 900.0, "server_ms": 200.0}, {"click_to_chip_ms": 1000.0, "server_ms": float("nan")},
             {"click_to_chip_ms": 950.0, "server_ms": 260.0}]
    text = render({"1 session stepping": one, "8 sessions stepping": eight}, 2, "tiny",
                  ((0.1, 0.1, 0.1), (2.0, 1.0, 0.5)), "150", "python -m bench load")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "scenario" not in line]
    assert rows[0] == "| 1 session stepping | 2 | 110 / 119 | 310 / 319 | 1.00× |"
    # the step whose caption was not read counts in click→chip but not in server time
    assert rows[1] == "| 8 sessions stepping | 3 | 230 / 257 | 950 / 995 | 2.09× |"
    assert "None" not in text and "nan" not in text


def test_low_priority_browsers_are_named_in_the_report(tmp_path):
    from bench.load import _idle_chromium

    launcher = Path(_idle_chromium(tmp_path))
    assert launcher.read_text().splitlines()[1].startswith("exec chrt --idle 0 ")
    assert os.access(launcher, os.X_OK)
    rows = {"1 session stepping": [{"click_to_chip_ms": 300.0, "server_ms": 100.0}]}
    low = render(rows, 1, "tiny", ((0.1,) * 3, (0.2,) * 3), "150", "cmd", "low")
    normal = render(rows, 1, "tiny", ((0.1,) * 3, (0.2,) * 3), "150", "cmd")
    assert "lowest CPU priority" in low and "browsers at low priority" in low.splitlines()[0]
    assert "lowest CPU priority" not in normal and "same CPU priority" in normal
