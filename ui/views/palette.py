"""Okabe-Ito colours (safe for the common colour-vision deficiencies); each colour has a text or
shape twin so nothing is told by colour alone."""
from __future__ import annotations

from dataclasses import dataclass

ORANGE = "#E69F00"
SKY = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
BLACK = "#000000"
GREY = "#999999"


@dataclass(frozen=True)
class Origin:
    """How a token came to be emitted, drawn as a chip: colour + underline style + a mark."""

    name: str
    label: str
    color: str
    line: str      # CSS border-bottom style: solid | dashed | dotted | double
    mark: str      # short text twin shown after the piece ("" for plain target tokens)


ORIGINS: dict[str, Origin] = {o.name: o for o in (
    Origin("target", "target", BLUE, "solid", ""),
    Origin("forced", "forced by you", ORANGE, "dashed", "⚑"),
    Origin("accepted", "accepted draft", GREEN, "solid", "✓"),
    Origin("rejected", "rejected draft", VERMILLION, "dotted", "✗"),
    Origin("residual", "residual resample", PURPLE, "double", "↺"),
    Origin("bonus", "bonus", SKY, "double", "+"),
)}

# Filters that remove candidates: bar pattern (shape twin) and colour.
FILTER_STYLE: dict[str, tuple[str, str]] = {
    "top_k": (VERMILLION, "x"),
    "top_p": (PURPLE, "/"),
    "min_p": (ORANGE, "."),
}
RAW_COLOR = SKY
PROCESSED_COLOR = BLUE

# Timing phases, in a stable colour order (phases not listed cycle through the rest).
PHASE_COLORS = (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, GREY)
LANE_COLORS = (BLUE, ORANGE, GREEN, VERMILLION)
LANE_DASHES = ("solid", "dash", "dot", "dashdot")
