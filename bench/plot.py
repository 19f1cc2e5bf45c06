"""Charts for BENCHMARKS.md as PNG without kaleido or matplotlib: the figure goes through the app's
own SVG exporter (ui/views/svg.py) and Debian's Chromium renders it to PNG (bench/browser.py's launcher)."""
from __future__ import annotations

from pathlib import Path

from ui.views.svg import figure_svg

PLOTS = Path(__file__).resolve().parents[1] / "assets" / "bench"


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
    from bench.browser import CHROMIUM, launch_chromium

    if not Path(CHROMIUM).exists():
        print(f"plot: {CHROMIUM} not found, {name}.png not written")
        return None
    from playwright.sync_api import sync_playwright

    svg = figure_svg(fig, width=width)
    PLOTS.mkdir(parents=True, exist_ok=True)
    out = PLOTS / f"{name}.png"
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": width, "height": 480})
            page.set_content(f"<html><body style='margin:0;background:#fff'>{svg}</body></html>")
            page.locator("svg").first.screenshot(path=str(out))
        finally:
            browser.close()
    return out
