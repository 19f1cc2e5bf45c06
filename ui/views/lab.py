"""The Lab's views: measurements -> pandas tables, plotly figures and the sentences that read them.
Pure (no streamlit, no torch), so a notebook can call them on its own measurements."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from decoding.core.errors import ConfigError
from decoding.core.formulas import break_even_tau, flattening_point, needed_acceptance
from decoding.core.measures import BatchDecode, DeviceRates, ForwardTime
from decoding.core.roofline import (
    ModelShape,
    bound_by,
    forward_bytes,
    forward_flops,
    ridge_intensity,
    ridge_tokens,
    roofline_ms,
)
from ui.views import palette
from ui.views.headers import header

FLAT_RATIO = 1.25      # verify(9) / verify(1) at or below this: the forward is flat in n (bound by reading)
MIN_REPEATS = 3        # fewer timed repeats per point: no spread to judge by, so no verdict is named
AXIS_NAMES = {"tokens": "n new tokens, one sequence", "batch": "b sequences, one new token each"}
FORWARD_AXIS = "new tokens in the forward (n in one sequence, or b sequences × 1)"   # both series' x


def parse_points(text: str, param: str) -> tuple[int, ...]:
    """"1, 2, 4" as (1, 2, 4); anything but integers separated by commas or spaces is a ConfigError naming
    `param` (the config checks the range)."""
    parts = [part for part in str(text).replace(",", " ").split() if part]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise ConfigError(param, text, "must be integers separated by commas, e.g. 1, 2, 4") from None
    if not values:
        raise ConfigError(param, text, "must list at least one integer, e.g. 1, 2, 4")
    return values


def points_text(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


@dataclass(frozen=True)
class CostReport:
    """What `measure_cost` yielded, gathered: the model's shape, the device's rates, the timed points."""
    shape: ModelShape
    rates: DeviceRates
    points: tuple[ForwardTime, ...]
    prefix_tokens: int

    def axis(self, name: str) -> list[ForwardTime]:
        return [p for p in self.points if p.axis == name]

    def ms(self, axis: str, n: int) -> float | None:
        return next((p.ms for p in self.axis(axis) if p.n == n), None)


def spread(point: ForwardTime) -> tuple[float, float]:
    """(lowest, highest) of a point's timed repeats."""
    return min(point.times_ms), max(point.times_ms)


def cost_report(events: Iterable, prefix_tokens: int) -> CostReport:
    """Gather measure_cost's events (the shape, the rates, then the points, in any order)."""
    events = list(events)
    shape = next(e for e in events if isinstance(e, ModelShape))
    rates = next(e for e in events if isinstance(e, DeviceRates))
    return CostReport(shape, rates, tuple(e for e in events if isinstance(e, ForwardTime)), prefix_tokens)


def _work(report: CostReport, point: ForwardTime) -> tuple[int, int]:
    """(FLOPs, bytes) of a measured point's forward."""
    new, batch = (point.n, 1) if point.axis == "tokens" else (1, point.n)
    return (forward_flops(report.shape, new, report.prefix_tokens, batch),
            forward_bytes(report.shape, new, report.prefix_tokens, batch))


def cost_table(report: CostReport) -> pd.DataFrame:
    """One row per measured point: the time, the roofline's least time and what bounds it."""
    rates = report.rates
    rows = []
    for p in report.points:
        flops, read = _work(report, p)
        least = roofline_ms(flops, read, rates.flops_per_s, rates.bytes_per_s)
        low, high = spread(p)
        rows.append({"forward": AXIS_NAMES[p.axis], "n": p.n, "measured_ms": p.ms, "spread_ms": high - low,
                     "repeats": len(p.times_ms), "ms_per_token": p.ms / p.n, "roofline_ms": least,
                     "bound_by": bound_by(flops, read, rates.flops_per_s, rates.bytes_per_s),
                     "gflop": flops / 1e9, "mb_read": read / 1e6, "flop_per_byte": flops / read,
                     "roofline_share": least / p.ms})
    return pd.DataFrame(rows)


KEY_COST_COLUMNS = ["forward", "n", "measured_ms", "spread_ms", "repeats", "ms_per_token", "roofline_ms", "bound_by"]


def rounded(table: pd.DataFrame) -> pd.DataFrame:
    """A copy with measured figures to the digits a timing supports: milliseconds (an "ms" in the column's
    name) to 0.1, the rest to three significant digits (the builders keep every digit, for notebooks)."""
    table = table.copy()
    for column in table.columns:
        if table[column].dtype.kind == "f":
            table[column] = (table[column].round(1) if "ms" in column.split("_")
                             else table[column].map(_three_digits))
    return table


def _three_digits(value: float) -> float:
    return float(f"{value:.3g}") if value == value else value


def device_table(report: CostReport) -> pd.DataFrame:
    """The figures the roofline is drawn from, with what each was measured on."""
    shape, rates = report.shape, report.rates
    return pd.DataFrame([
        {"quantity": "weights read per forward", "value": f"{shape.weight_bytes / 1e6:,.1f} MB",
         "how": f"every linear layer's weights once ({shape.linear_params / 1e6:,.1f} M in the products)"},
        {"quantity": "KV cache per token", "value": f"{shape.kv_bytes_per_token / 1e3:,.1f} kB",
         "how": f"2 × {shape.layers} layers × {shape.kv_dim} × {shape.element_bytes} bytes"},
        {"quantity": "memory bandwidth", "value": f"{rates.bytes_per_s / 1e9:,.1f} GB/s",
         "how": f"reading {rates.read_bytes >> 20} MiB once, best of 5"},
        {"quantity": "arithmetic rate", "value": f"{rates.flops_per_s / 1e9:,.1f} GFLOP/s",
         "how": f"{rates.product}, best of 5"},
        {"quantity": "ridge", "value": f"{ridge_intensity(rates.flops_per_s, rates.bytes_per_s):,.1f} FLOP/byte",
         "how": ridge_text(report)},
    ])


def ridge_range(report: CostReport) -> tuple[int | None, int | None]:
    """The first compute-bound n under the rates' two extremes (slow arithmetic with a fast read turns
    compute-bound earliest, fast arithmetic with a slow read latest): the ridge lies between them. Rates
    without a spread give one n twice."""
    shape, rates = report.shape, report.rates
    flops_low = rates.flops_per_s_low or rates.flops_per_s
    bytes_low = rates.bytes_per_s_low or rates.bytes_per_s
    early = ridge_tokens(shape, report.prefix_tokens, flops_low, rates.bytes_per_s)
    late = ridge_tokens(shape, report.prefix_tokens, rates.flops_per_s, bytes_low)
    return early, late


def ridge_text(report: CostReport) -> str:
    """Where a forward turns compute-bound, named only as firmly as the rates' repeats allow."""
    early, late = ridge_range(report)
    if early is None and late is None:
        return "no forward up to 65,536 new tokens is compute-bound"
    if early == late:
        return f"a forward turns compute-bound at n = {early} new tokens (the same at every repeat's rates)"
    upper = f"n = {late}" if late is not None else "beyond 65,536"
    return f"compute-bound from between n = {early} and {upper} new tokens (the repeats' spread)"


def cost_figure(report: CostReport) -> go.Figure:
    """Measured ms against the tokens in the forward (both axes), the roofline's least time, and the
    floor of reading the weights once."""
    fig = go.Figure()
    styles = {"tokens": (palette.BLUE, "solid", "circle"), "batch": (palette.ORANGE, "dash", "square")}
    for axis, (color, dash, symbol) in styles.items():
        points = report.axis(axis)
        if not points:
            continue
        low_high = [spread(p) for p in points]
        fig.add_scatter(x=[p.n for p in points], y=[p.ms for p in points], mode="lines+markers",
                        name=f"measured: {AXIS_NAMES[axis]} (median; bar: lowest to highest repeat)",
                        line={"color": color, "dash": dash}, marker={"symbol": symbol, "size": 8},
                        error_y={"type": "data", "symmetric": False, "color": color,
                                 "array": [hi - p.ms for p, (_, hi) in zip(points, low_high)],
                                 "arrayminus": [p.ms - lo for p, (lo, _) in zip(points, low_high)]})
    tokens = report.axis("tokens") or report.axis("batch")
    least = [roofline_ms(*_work(report, p), report.rates.flops_per_s, report.rates.bytes_per_s) for p in tokens]
    fig.add_scatter(x=[p.n for p in tokens], y=least, mode="lines", name="roofline: least time the device allows",
                    line={"color": palette.GREY, "dash": "dot", "width": 3})
    floor = 1000.0 * report.shape.weight_bytes / report.rates.bytes_per_s
    fig.add_hline(y=floor, line={"color": palette.GREEN, "dash": "longdash"},
                  annotation_text=f"reading the weights once: {floor:.1f} ms", annotation_position="bottom right")
    repeats = min((len(p.times_ms) for p in report.points), default=0)
    fig.update_layout(title=f"Cost of a forward (median of {repeats} repeats or more per point)",
                      xaxis={"title": FORWARD_AXIS, "type": "log", "dtick": 0.30103},
                      yaxis={"title": header("measured_ms"), "rangemode": "tozero"}, height=420,
                      legend={"orientation": "h", "y": -0.3}, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


def speculation_table(report: CostReport) -> pd.DataFrame:
    """Per measured n ≥ 2 (γ = n − 1 drafts verified in one forward): the forward's cost against a 1-token
    forward, the tokens per round a free drafter must reach to beat greedy, and the acceptance rate at every
    position that gives it."""
    one = report.ms("tokens", 1)
    rows = []
    for p in report.axis("tokens"):
        if one is None or p.n < 2:
            continue
        tau = break_even_tau(p.ms, one)
        alpha = needed_acceptance(tau, p.n - 1)
        rows.append({"gamma": p.n - 1, "verify_ms": p.ms, "verify_ratio": p.ms / one, "tau_to_beat_greedy": tau,
                     "acceptance_needed": alpha if alpha is not None else float("nan")})
    return pd.DataFrame(rows)


def verify_ratio(report: CostReport, n: int = 9) -> tuple[int, float] | None:
    """(n, verify(n) / verify(1)) at the measured n closest to `n`; None without n = 1 and one more."""
    found = _ratio_points(report, n)
    return None if found is None else (found[1].n, found[1].ms / found[0].ms)


def _ratio_points(report: CostReport, n: int = 9) -> tuple[ForwardTime, ForwardTime] | None:
    one = next((p for p in report.axis("tokens") if p.n == 1), None)
    others = [p for p in report.axis("tokens") if p.n > 1]
    if one is None or not others:
        return None
    return one, min(others, key=lambda p: (abs(p.n - n), p.n))


def ratio_spread(one: ForwardTime, point: ForwardTime) -> tuple[float, float]:
    """The lowest and highest verify(n) / verify(1) the repeats allow (each end from the extremes)."""
    (one_lo, one_hi), (lo, hi) = spread(one), spread(point)
    return lo / one_hi, hi / one_lo


def regime(report: CostReport) -> str:
    """Which curve the user is looking at, in one paragraph: "flat" or "steep" only when every ratio the
    repeats allow lies on the same side of FLAT_RATIO, from MIN_REPEATS repeats or more."""
    found = _ratio_points(report)
    if found is None:
        return "Measure n = 1 and at least one larger n to compare verification with a one-token step."
    one_point, point = found
    ratio = point.ms / one_point.ms
    low, high = ratio_spread(one_point, point)
    head = (f"Verifying {point.n - 1} drafts (a forward over {point.n} tokens) costs {ratio:.2f}× a one-token "
            f"forward (medians; the repeats allow {low:.2f}× to {high:.2f}×).")
    one = one_point.ms
    least = roofline_ms(forward_flops(report.shape, 1, report.prefix_tokens),
                        forward_bytes(report.shape, 1, report.prefix_tokens),
                        report.rates.flops_per_s, report.rates.bytes_per_s)
    overhead = (f" A one-token forward takes {one:.1f} ms against the roofline's {least:.1f} ms: "
                f"{100 * least / one:.0f} % of it is the least the device allows, the rest is per-layer "
                "overhead (kernel launches, Python, small matrix products).")
    repeats = min(len(one_point.times_ms), len(point.times_ms))
    if repeats < MIN_REPEATS:
        return (head + f" With {repeats} repeat(s) per point there is no spread to judge by: measure with "
                f"{MIN_REPEATS} repeats or more before calling the curve flat or steep." + overhead)
    if high <= FLAT_RATIO:
        return (head + " The curve is **flat**: the forward is bound by reading the weights, so a few more tokens "
                "are nearly free — speculative decoding pays off even at modest acceptance." + overhead)
    if low > FLAT_RATIO:
        return (head + " The curve is **steep**: each extra token costs real compute here, so a draft must be "
                "accepted far enough to pay for its verification (the table below gives the τ each γ needs)."
                + overhead)
    return (head + f" The spread straddles {FLAT_RATIO:.2f}×, the line between flat and steep: the machine was "
            "too noisy to tell; measure again with more repeats." + overhead)


# ---------------------------------------------------------------- throughput against latency
def throughput_table(results: Sequence[BatchDecode]) -> pd.DataFrame:
    base = results[0].tokens_per_s if results else 1.0
    return pd.DataFrame([{"batch": r.batch, "tokens_per_s": r.tokens_per_s,
                          "throughput_vs_first": r.tokens_per_s / base, "latency_p50_ms": r.latency_ms(50),
                          "latency_p99_ms": r.latency_ms(99), "steps": len(r.step_ms)} for r in results])


def throughput_figure(results: Sequence[BatchDecode]) -> go.Figure:
    """Tokens/s (bars, left axis) and each request's ms per token, p50 and p99 (lines, right axis)."""
    xs = [str(r.batch) for r in results]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[r.tokens_per_s for r in results], name="throughput (tokens/s, all requests)",
                marker={"color": palette.SKY})
    for q, dash, color in ((50, "solid", palette.VERMILLION), (99, "dot", palette.PURPLE)):
        fig.add_scatter(x=xs, y=[r.latency_ms(q) for r in results], yaxis="y2", mode="lines+markers",
                        name=f"latency p{q} (ms per token, each request)", line={"color": color, "dash": dash})
    fig.update_layout(title="Throughput against latency (greedy decoding, b copies of the prompt)",
                      xaxis={"title": "batch size b", "type": "category"},
                      yaxis={"title": "tokens/s", "rangemode": "tozero"},
                      yaxis2={"title": "ms per token", "overlaying": "y", "side": "right", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.3}, height=420, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


def tradeoff(results: Sequence[BatchDecode]) -> str:
    """The trade-off measured, in one paragraph."""
    if len(results) < 2:
        return "Measure at least two batch sizes to see the trade-off."
    first, last = results[0], results[-1]
    flat = flattening_point([r.batch for r in results], [r.tokens_per_s for r in results])
    where = (f"Throughput flattens from b = {flat} on (less than 10 % more per doubling)." if flat is not None
             else "Throughput still grows by 10 % or more per doubling at the largest batch measured.")
    return (f"From b = {first.batch} to b = {last.batch}: throughput {first.tokens_per_s:.1f} → "
            f"{last.tokens_per_s:.1f} tokens/s ({last.tokens_per_s / first.tokens_per_s:.1f}×), while each request "
            f"waits {first.latency_ms(50):.0f} → {last.latency_ms(50):.0f} ms per token (p50). " + where)
