"""Pure helpers of the app benchmark (bench/app.py): the timing caption, the summary and the load note."""
import pytest

from bench.app import cell, load_note, parse_timing, render, summarize


def test_parse_timing_reads_the_playground_caption():
    text = "This rerun: model 42 ms, page beyond the model 137 ms (server side)."
    assert parse_timing(text) == (42.0, 137.0)
    assert parse_timing("This rerun: model 0 ms, page beyond the model -3 ms (server side).") == (0.0, -3.0)


def test_parse_timing_refuses_other_text():
    with pytest.raises(ValueError, match="no timing caption"):
        parse_timing("3 steps recorded (in progress), numbered 0–2; viewing step 2.")


def test_summarize_median_min_max():
    assert summarize([5.0, 1.0, 3.0]) == {"median": 3.0, "min": 1.0, "max": 5.0, "n": 3}
    assert summarize([4.0, 1.0, 2.0, 10.0])["median"] == 3.0      # even count: mean of the middle two
    assert cell([120.4, 80.0, 300.6]) == "120 [80–301]"


def test_summarize_refuses_an_empty_list():
    with pytest.raises(ValueError):
        summarize([])


def test_load_note_says_whether_the_machine_was_busy():
    busy = load_note((7.5, 6.0, 5.0), (1.0, 1.0, 1.0), 2)
    assert "7.50/6.00/5.00" in busy and "upper bounds" in busy
    quiet = load_note((0.5, 0.4, 0.3), (1.9, 0.5, 0.3), 2)
    assert "1.90/0.50/0.30" in quiet and "upper bounds" not in quiet and "quiet" in quiet
    # the load after the run is the benchmark's own (server, browser, driver): it does not make a run busy
    loaded_by_itself = load_note((0.5, 0.4, 0.3), (2.4, 1.8, 1.8), 2)
    assert "upper bounds" not in loaded_by_itself and "own server, browser and driver" in loaded_by_itself


def test_render_has_one_row_per_strategy_and_the_floor():
    rows = [{"click_to_chip_ms": 300.0, "model_ms": 20.0, "server_ms": 90.0, "beyond_model_ms": 280.0},
            {"click_to_chip_ms": 200.0, "model_ms": 10.0, "server_ms": 70.0, "beyond_model_ms": 190.0}]
    text = render({"greedy": rows}, [110.0, 130.0], 2, ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)), "1.0")
    assert "| Playground Step, greedy | 250 [200–300] | 15 [10–20] | 235 [190–280] | 80 [70–90] |" in text
    assert "| floor: bare Streamlit button | 120 [110–130] | — | 120 [110–130] | — |" in text
    assert "`python -m bench app --steps 2`" in text


def test_render_lists_the_first_page_times():
    rows = [{"click_to_chip_ms": 300.0, "model_ms": 20.0, "server_ms": 90.0, "beyond_model_ms": 280.0}]
    first = {"new machine": 31.24, "cold server": 12.06, "warm (second session)": 1.5}
    text = render({"greedy": rows}, [110.0], 1, ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)), "1.0", first)
    assert "| new machine | 31.2 |" in text and "| cold server | 12.1 |" in text
    assert "| warm (second session) | 1.5 |" in text and "≤ 20 s cold, ≤ 5 s warm" in text
    assert "First page" not in render({"greedy": rows}, [110.0], 1, ((1.0,) * 3, (1.0,) * 3), "1.0")


def test_render_lists_the_long_runs_per_token_app_against_command_line():
    rows = [{"click_to_chip_ms": 300.0, "model_ms": 20.0, "server_ms": 90.0, "beyond_model_ms": 280.0}]
    long_runs = {"greedy": {"app": {"tokens": 96, "model_ms": 4800.0, "wall_s": 9.04},
                            "cli": {"tokens": 96, "model_ms": 3840.0}}}
    text = render({"greedy": rows}, [110.0], 1, ((1.0,) * 3, (1.0,) * 3), "1.0", None, long_runs)
    assert "| greedy | 96 / 96 | 50.0 | 40.0 | 1.25 | 9.0 |" in text
    assert "Run to end on the embedded model" in text
    assert "Run to end on the embedded model" not in render({"greedy": rows}, [110.0], 1,
                                                            ((1.0,) * 3, (1.0,) * 3), "1.0")
