"""Charts for BENCHMARKS.md as PNG without kaleido or matplotlib: the figure is drawn by plotly.js (the
copy inside the plotly package, so offline) in Debian's Chromium (bench/browser.py's launcher), and
plotly.js's own toImage writes the PNG — the same export as the app's chart toolbar."""
from __future__ import annotations

import base64
from pathlib import Path

from decoding.runtime.paths import ASSETS

PLOTS = ASSETS / "bench"


def speedup_figure(points: dict[str, tuple[list[int], list[float]]], title: str):
    """Lines of speed vs γ, one per series (name -> (γs, speedups)), with the greedy line at 1."""
    import plotly.graph_objects as go

    from ui.views import palette

    colors = (palette.BLUE, palette.ORANGE, palette.GREEN, palette.VERMILLION)
    symbols = ("circle", "square", "diamond", "x")
    fig = go.Figure()
    for i, (name, (xs, ys)) in enumerate(points.items()):
        fig.add_scatter(name=name, x=xs, y=ys, mode="lines+markers",
                        line={"color": colors[i % 4]}, marker={"symbol": symbols[i % 4], "size": 9})
    fig.add_hline(y=1.0, line={"color": palette.GREY, "dash": "dash"}, annotation_text="plain greedy")
    fig.update_layout(title=title, xaxis={"title": "γ", "dtick": 4}, yaxis_title="speed vs our greedy (×), or τ",
                      legend={"orientation": "h", "y": -0.25}, height=420)
    return fig


def save_png(fig, name: str, width: int = 900) -> Path | None:
    """Render the figure to assets/bench/<name>.png with Chromium; None (and a message) without it."""
    from bench.browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        print(f"plot: {CHROMIUM} not found, {name}.png not written")
        return None
    height = fig.layout.height or 480
    page_html = fig.to_html(include_plotlyjs=True, full_html=True, div_id="chart", config={"staticPlot": True},
                            default_width=f"{width}px", default_height=f"{height}px")
    PLOTS.mkdir(parents=True, exist_ok=True)
    out = PLOTS / f"{name}.png"
    out.write_bytes(_png(page_html, width, height))
    return out


def _png(page_html: str, width: int, height: int) -> bytes:
    """The chart of `page_html` (div "chart") as PNG, by plotly.js's toImage in headless Chromium."""
    from playwright.sync_api import sync_playwright

    from bench.browser import launch_chromium

    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_content(page_html)
            url = page.evaluate("([w, h]) => Plotly.toImage('chart', {format: 'png', width: w, height: h})",
                                [width, height])
        finally:
            browser.close()
    return base64.b64decode(url.split(",", 1)[1])
