"""Trace -> pandas tables and running metrics. Pure: plain values in, DataFrames/dicts out."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePath

import pandas as pd

from decoding.core.formulas import speed_vs
from decoding.core.trace_totals import emitted_count
from decoding.runtime.cost_table import AUTO_SOURCE
from ui.views.chips import first_divergence, visible
from ui.views.glossary import counted_from_1


def _table_file(source: str) -> tuple[bool, str]:
    """(whether it is the table "auto" profiles, its file name) of a cost table's source: AUTO_SOURCE and a
    name that says model, device and dtype; traces before it stored its path, in the cache's `cost` folder."""
    text = str(source)
    path = PurePath(text.removeprefix(AUTO_SOURCE).replace("\\", "/"))
    return text.startswith(AUTO_SOURCE) or path.parent.name == "cost", path.name


def table_name(source: str) -> str:
    """A cost table's source as the page shows it: the table "auto" profiles in words (its cache file's name
    means nothing to a student), a table the user gave by its file name, never a path."""
    auto, name = _table_file(source)
    return "auto, profiled on this machine" if auto else name


def nats(value: float) -> float:
    """An entropy as shown: never below 0 (float round-off gives −1e-9 for a certain distribution, drawn
    "-0")."""
    return max(0.0, float(value)) + 0.0


def table_short(source: str) -> str:
    """A cost table's source in a few words, for a table cell: "auto" or its file name."""
    auto, name = _table_file(source)
    return "auto" if auto else name


def _p(logprob: float) -> float:
    return math.exp(logprob) if math.isfinite(logprob) else 0.0


def token_row(event) -> dict:
    return {"step": event.index, "position": counted_from_1(event.position), "token_id": event.chosen_id,
            "piece": visible(event.chosen_piece), "forced": event.forced,
            "p_processed": _p(event.chosen_logprob), "p_raw": _p(event.chosen_raw_logprob),
            "raw_rank": counted_from_1(event.chosen_rank), "entropy_raw": event.entropy_raw,
            "entropy_processed": event.entropy_processed, "u": event.draw,
            "ms": sum(event.timings_ms.values())}


STEP_ROWS: dict[str, Callable[[object], dict]] = {"token": token_row}


def register_rows(kind: str, row: Callable[[object], dict]) -> None:
    STEP_ROWS[kind] = row


STEPS_HEADERS = {"position": "position in the text"}    # a step's first new token's place (glossary)


def steps_table(events: Sequence) -> pd.DataFrame:
    rows = []
    for i, event in enumerate(events):
        row = STEP_ROWS.get(getattr(event, "kind", ""))
        rows.append(row(event) if row else {"step": i, "kind": getattr(event, "kind", "?")})
    return pd.DataFrame(rows)


CANDIDATE_COLUMNS = ["rank", "token_id", "piece", "logit_raw", "p_raw", "logit_processed",
                     "p_processed", "removed_by", "chosen"]


def candidates_table(step) -> pd.DataFrame:
    rows = [{"rank": i, "token_id": raw.token_id, "piece": visible(raw.piece), "logit_raw": raw.logit,
             "p_raw": raw.prob, "logit_processed": proc.logit, "p_processed": proc.prob,
             "removed_by": proc.removed_by or "", "chosen": raw.token_id == step.chosen_id}
            for i, (raw, proc) in enumerate(zip(step.raw_top, step.processed_top), start=1)]
    return pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)


# Where each filter cut, in words: its recorded threshold means something else per filter (trace.FilterCut).
CUT_WORDS = {"top_k": "logit ≥ {t:.4g} (the k-th largest)", "top_p": "kept mass {t:.4f} (the first ≥ top-p)",
             "min_p": "p ≥ {t:.4g} (min-p × the top p)"}


def cut_words(name: str, threshold: float | None) -> str | None:
    """A filter's cut in words ("logit ≥ 29.65 (the k-th largest)"); None where it has none (temperature)."""
    form = CUT_WORDS.get(name)
    return form.format(t=threshold) if form and threshold is not None else None


def filters_table(step) -> pd.DataFrame:
    rows = [{"filter": c.name, "value": c.value, "cut_at": cut_words(c.name, c.threshold),
             "removed_mass": c.removed_mass, "removed_count": c.removed_count, "kept_count": c.kept_count,
             "threshold": c.threshold} for c in step.filters]
    return pd.DataFrame(rows, columns=["filter", "value", "cut_at", "removed_mass", "removed_count", "kept_count",
                                       "threshold"])


def running_metrics(events: Sequence) -> dict:
    """Tokens, target forwards and tokens/s over the steps so far (time = sum of the steps' measured
    timings, so pauses between clicks do not count)."""
    tokens = sum(emitted_count(e) for e in events)
    forwards = sum(getattr(e, "target_forwards", 1) for e in events)
    ms = sum(sum(getattr(e, "timings_ms", {}).values()) for e in events)
    return {"tokens": tokens, "target_forwards": forwards, "model_ms": ms,
            "tokens_per_s": tokens / (ms / 1000.0) if ms > 0 else 0.0,
            "tokens_per_forward": tokens / forwards if forwards else 0.0}


def greedy_lane(traces: Mapping[str, object]) -> str | None:
    """The label of the first greedy lane (the speedup reference), None when there is none."""
    return next((label for label, trace in traces.items() if trace.strategy == "greedy"), None)


METRICS_HEADERS = {"tokens_per_s": "tokens/s (wall time)"}
# Compare shows metrics_table in two tables of the same lanes, speed first: its 13 columns in one table
# scrolled sideways at the page's width (1400 px window).
METRICS_PARTS = (("lane", "tokens", "wall_s", "tokens_per_s", "step_tokens_per_s", "speedup_vs_greedy", "tau"),
                 ("lane", "strategy", "target_forwards", "tokens_per_forward", "acceptance_rate", "first_divergence",
                  "stop_reason"))


def metrics_table(traces: Mapping[str, object]) -> pd.DataFrame:
    """One row per labelled trace; divergence is counted against the first trace's output (the first new
    token is token 1, as in Compare's verdict).
    speedup_vs_greedy = step_tokens_per_s / that of the first greedy lane, where step_tokens_per_s
    counts the steps' measured time only (one-off set-up such as loading a drafter is left out);
    None in every row when no lane is greedy. tau and acceptance_rate: speculative / dspark only."""
    rows, base = [], None
    reference = greedy_lane(traces)
    ref_rate = running_metrics(traces[reference].steps)["tokens_per_s"] if reference is not None else 0.0
    for label, trace in traces.items():
        metrics = running_metrics(trace.steps)
        base = trace.output_ids if base is None else base
        rows.append({"lane": label, "strategy": trace.strategy, "tokens": trace.stats.new_tokens,
                     "target_forwards": trace.stats.target_forwards,
                     "tokens_per_forward": metrics["tokens_per_forward"],
                     "wall_s": trace.stats.wall_s, "tokens_per_s": trace.stats.tokens_per_s,
                     "step_tokens_per_s": metrics["tokens_per_s"],
                     "speedup_vs_greedy": speed_vs(metrics["tokens_per_s"], ref_rate),
                     "tau": trace.stats.mean_accepted_length, "acceptance_rate": trace.stats.acceptance_rate,
                     "first_divergence": counted_from_1(first_divergence(base, trace.output_ids)),
                     "stop_reason": trace.stop_reason})
    return pd.DataFrame(rows)

