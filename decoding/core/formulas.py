"""Shared formulas: one definition of each rule that the strategies, the benchmarks and the views use.

Pure functions over plain Python numbers (int, float, fractions.Fraction) and token ids; no torch, so
the UI may import this module. Nothing is rounded: Fractions in give exact Fractions out, and a float
result is summed in the order written here (the recorded traces depend on it).

Expected accepted length. A verification round whose draft position i is accepted with probability a_i
given every position before it was accepted (a chain) survives to position k with probability
S_k = Π_{i≤k} a_i, and accepts E[accepted] = Σ_k S_k drafts on average; it emits 1 + E[accepted]
tokens (the accepted drafts, then a residual or bonus token). A tree of draft nodes accepts
Σ_nodes S_node on average, S_node being the product along the node's path, so the same sums price
a chain (S from `survival`) and a best-first tree (S recorded per node).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


# ------------------------------------------------------------------------ expected accepted length
def survival(acceptance_probs: Iterable) -> list:
    """S_k = Π_{i≤k} a_i for k = 1..n: the probability that a chain's first k drafts are all accepted."""
    out, running = [], 1
    for a in acceptance_probs:
        running = running * a
        out.append(running)
    return out


def expected_accepted_by_size(survivals: Iterable, start=0) -> list:
    """start + Σ_{i≤n} S_i for n = 1..N: E[accepted drafts] of the plan made of the first n nodes
    (a chain's first n positions, or a best-first tree's first n nodes), given each node's survival
    S_i. start=1 gives the expected tokens per verification forward (1 + E[accepted]) per size."""
    out, total = [], start
    for s in survivals:
        total = total + s
        out.append(total)
    return out


def plan_expected_accepted(survivals: Iterable):
    """E[accepted drafts] of a whole plan (chain or tree): Σ_nodes S_node; 0 for no nodes."""
    total = 0
    for s in survivals:
        total = total + s
    return total


def expected_accepted(acceptance_probs: Sequence, length: int | None = None):
    """E[accepted drafts] of a chain: Σ_{k=1}^{L} Π_{i≤k} a_i over its first L = `length` positions
    (all of them when None; fewer when fewer are given); 0 for none."""
    return plan_expected_accepted(survival(acceptance_probs[:length]))


def tokens_per_round(expected_accepted_drafts):
    """Expected tokens one verification round emits: its accepted drafts, then one residual or bonus token
    (1 + E[accepted]; τ, when averaged over measured rounds)."""
    return 1 + expected_accepted_drafts


def uniform_chain_tokens(alpha, gamma: int):
    """1 + α + α² + … + α^γ: the expected tokens per round of a chain of γ drafts, each accepted with α
    given that those before it were."""
    return tokens_per_round(expected_accepted([alpha] * gamma))


# ------------------------------------------------------------------------ cost of a speculative round
def round_ms(verify_ms: float, drafts: int, draft_token_ms: float) -> float:
    """What a speculative round costs: one target forward over drafts + 1 tokens (`verify_ms`, read
    from a cost table) plus `drafts` draft tokens of `draft_token_ms` each (0 for prompt lookup)."""
    return verify_ms + drafts * draft_token_ms


def break_even_tau(round_cost_ms: float, greedy_token_ms: float, speedup: float = 1.0) -> float:
    """The tokens per round (τ) at which rounds costing `round_cost_ms` each run at `speedup` × the
    speed of plain greedy decoding, which pays `greedy_token_ms` per token: speedup · round / greedy."""
    return speedup * round_cost_ms / greedy_token_ms


def needed_acceptance(tau: float, gamma: int, tol: float = 1e-9) -> float | None:
    """The acceptance rate α, the same at every position, at which a chain of γ drafts emits `tau`
    tokens per round on average: 1 + α + α² + … + α^γ = tau (bisection; the sum rises with α). 0 for
    tau <= 1; None when tau > γ + 1 (not even α = 1 gets there)."""
    if tau <= 1:
        return 0.0
    if tau > gamma + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if uniform_chain_tokens(mid, gamma) < tau else (lo, mid)
    return hi


def speed_vs(rate: float, reference_rate: float) -> float | None:
    """Speed against a reference (plain greedy): tokens/s ÷ the reference's tokens/s, both measured the same
    way; None when the reference measured no speed."""
    return rate / reference_rate if reference_rate > 0 else None


# ------------------------------------------------------------------------ metrics (vLLM's definitions)
def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """Accepted draft tokens / drafted (verified) draft tokens; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def round_metrics(emitted: Sequence[int], drafted: Sequence[int], accepted: Sequence[int],
                  depth: Sequence[int]) -> dict:
    """vLLM's speculative metrics over verification rounds r (one target forward each), given per round
    the tokens it emitted (forced tokens excluded), the draft nodes it verified, the drafts it accepted
    and its deepest verified position (a chain's γ; a tree's depth):
      mean_accepted_length (τ) = Σ emitted / rounds;
      acceptance_rate = Σ accepted / Σ drafted (None when nothing was drafted);
      per_position_acceptance[k] = #{r: depth_r > k and accepted_r > k} / #{r: depth_r > k}.
    {} for no rounds."""
    if not emitted:
        return {}
    per_position = tuple(
        sum(1 for d, a in zip(depth, accepted) if d > k and a > k) / sum(1 for d in depth if d > k)
        for k in range(max(depth, default=0)))
    return {"mean_accepted_length": sum(emitted) / len(emitted),
            "acceptance_rate": acceptance_rate(sum(accepted), sum(drafted)),
            "per_position_acceptance": per_position}


# ------------------------------------------------------------------------ end of the answer
def cut_at_eos(tokens: Iterable[int], eos_ids, limit: int | None = None) -> tuple[int, ...]:
    """The tokens up to and including the first EOS (an answer ends there, emitted or forced), at
    most `limit` of them (None: no limit; below 0: none). Cutting at the EOS and taking the first
    `limit` tokens commute, so either order gives this."""
    tokens = list(tokens)
    out = []
    for token in tokens[:max(limit, 0)] if limit is not None else tokens:
        out.append(int(token))
        if token in eos_ids:
            break
    return tuple(out)


CALIBRATION_BINS = 10


def reliability_bins(scores: Sequence[float], hits: Sequence[bool], bins: int = CALIBRATION_BINS
                     ) -> list[tuple[int, float, float, int]]:
    """Equal-width bins over [0, 1] (a score of 1 falls in the last): (bin, mean score, hit rate, count)
    for every non-empty bin, in order. A hit is a bool, or the probability of one (sampled decoding)."""
    sums: dict[int, list] = {}
    for score, hit in zip(scores, hits):
        b = min(int(float(score) * bins), bins - 1)
        acc = sums.setdefault(b, [0.0, 0, 0])
        acc[0] += float(score)
        acc[1] += float(hit)
        acc[2] += 1
    return [(b, s / n, h / n, n) for b, (s, h, n) in sorted(sums.items())]


def calibration_error(scores: Sequence[float], hits: Sequence[bool], bins: int = CALIBRATION_BINS) -> float | None:
    """Expected calibration error: Σ over bins of (count / N) · |mean score − hit rate|; None without samples."""
    rows = reliability_bins(scores, hits, bins)
    total = sum(n for *_, n in rows)
    return sum(n / total * abs(mean - rate) for _, mean, rate, n in rows) if total else None


# ------------------------------------------------------------------------ measurements
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks (numpy's
    default); with few values p99 is close to the largest."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def flattening_point(xs: Sequence[float], ys: Sequence[float], min_gain: float = 0.10) -> float | None:
    """The first x after which y grows by less than `min_gain` per doubling of x (x ascending, y > 0):
    where throughput against batch size flattens. None when every step still gains that much."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        doublings = math.log2(x1 / x0)
        if y1 / y0 < (1 + min_gain) ** doublings:
            return x0
    return None


def chi2_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X ~ χ² with `df` degrees of freedom: the regularized upper incomplete gamma
    function Q(df/2, statistic/2), by its power series below a + 1 and its continued fraction above."""
    if df < 1:
        raise ValueError(f"chi2_sf needs df >= 1, got {df}")
    a, x = df / 2, statistic / 2
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:                                   # P(a, x) = e^{-x} x^a / Γ(a) · Σ x^n / (a (a+1) … (a+n))
        term = total = 1 / a
        n = 1
        while abs(term) > abs(total) * 1e-15 and n < 10_000:
            term *= x / (a + n)
            total += term
            n += 1
        return max(0.0, 1 - math.exp(log_front) * total)
    tiny = 1e-300                                   # Q(a, x) by Lentz's method on its continued fraction
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def chi_square(counts: Sequence[int], expected_probs: Sequence[float], min_expected: float = 5.0
               ) -> tuple[float, int, float]:
    """Pearson's χ² of `counts` against `expected_probs` (same order, summing to 1): categories expected
    fewer than `min_expected` times are pooled into one (dropped if still under it). -> (statistic,
    degrees of freedom, p-value); p-value 1.0 when fewer than two categories are left."""
    n = sum(counts)
    big = [(c, p * n) for c, p in zip(counts, expected_probs) if p * n >= min_expected]
    pooled = [(c, p * n) for c, p in zip(counts, expected_probs) if p * n < min_expected]
    rest = (sum(c for c, _ in pooled), sum(e for _, e in pooled))
    cells = big + ([rest] if rest[1] >= min_expected else [])
    if len(cells) < 2:
        return 0.0, 0, 1.0
    statistic = sum((c - e) ** 2 / e for c, e in cells)
    return statistic, len(cells) - 1, chi2_sf(statistic, len(cells) - 1)
