"""The speculative benchmark's break-even arithmetic: the τ a draft needs for greedy's speed."""
from __future__ import annotations

import pytest

from bench.speculative import break_even, render_break_even


def test_break_even_rounds():
    rows = break_even((10.0, 11.0, 12.0, 20.0), draft_ms=1.0, gammas=(1, 3))
    assert [r["gamma"] for r in rows] == [1, 3]
    one, three = rows
    assert one["verify_ms"] == 11.0 and one["round_ms"] == 12.0       # 2-token forward + 1 draft token
    assert one["tau_parity"] == pytest.approx(1.2) and one["tau_1_2"] == pytest.approx(1.44)
    assert three["round_ms"] == 23.0 and three["tau_parity"] == pytest.approx(2.3) and three["tau_max"] == 4


def test_break_even_table():
    rows = break_even((10.0, 11.0), draft_ms=1.0, gammas=(1,))
    lines = render_break_even(rows, 1.0, 10.0)
    assert "| 1 | 11.0 | 12.0 | 1.20 | 1.44 | 2 |" in lines
    assert any("1 token 10.0 ms" in line and "draft-token forward 1.0 ms" in line for line in lines)
