"""The benchmark chart: one line per series with the greedy reference, and its PNG drawn by plotly.js in
Chromium (skipped with the reason where Debian's chromium is missing)."""
from pathlib import Path

import pytest

from bench import plot


def test_speedup_figure_has_the_series_and_the_greedy_line():
    fig = plot.speedup_figure({"chain": ([4, 8], [0.9, 0.7]), "tau": ([4, 8], [1.5, 1.6])}, "t")
    assert [t.name for t in fig.data] == ["chain", "tau"]
    assert list(fig.data[0].x) == [4, 8] and list(fig.data[1].y) == [1.5, 1.6]
    assert any(s.y0 == 1.0 and s.y1 == 1.0 for s in fig.layout.shapes)


@pytest.mark.browser
def test_png_is_written(tmp_path, monkeypatch):
    from bench.browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed")
    monkeypatch.setattr(plot, "PLOTS", tmp_path)
    out = plot.save_png(plot.speedup_figure({"a": ([1, 2], [1.0, 2.0])}, "t"), "x")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert int.from_bytes(data[16:20], "big") == 900 and int.from_bytes(data[20:24], "big") == 420  # IHDR size
