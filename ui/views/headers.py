"""What a table shows its users: the builders (ui/views/*) name columns by the trace's fields, for notebooks
and the CSV download; the page shows those columns in words, with units (HEADERS), whole numbers as whole
numbers, tiny probabilities to four significant digits (SMALL_FORMAT), verdicts, beam statuses and filter
names in words (VALUE_WORDS). The charts name what they show in the same words (header, value_word): a
legend says "p target", never p_target. A cell that does not apply is
drawn as NOT_APPLICABLE (ui.widgets.display.table passes it to st.dataframe as the text for missing values).
Pure: no streamlit."""
from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ui.views import glossary
from ui.views.beam import STATUS_STYLE

NOT_APPLICABLE = "—"
SMALL = 1e-3                  # a column holding a non-zero value below this gets SMALL_FORMAT
SMALL_FORMAT = "%.4g"         # printf style, as st.column_config.NumberColumn takes it

# One entry per field name; where a field means something else in one table, that table's view passes its
# own words over these (e.g. beam.HEADERS, tables.METRICS_HEADERS).
HEADERS: dict[str, str] = {
    # tokens and steps
    "step": "step", "text": "text", "position": "position", "token_id": "token id", "piece": "token",
    "forced": "forced", "kind": "step kind", "rank": "rank", "chosen": "chosen", "ms": "time (ms)", "u": "draw u",
    "p_raw": "p raw", "p_processed": "p processed", "logit_raw": "logit raw", "logit_processed": "logit processed",
    "raw_rank": "raw rank", "entropy_raw": "entropy raw (nats)", "entropy_processed": "entropy processed (nats)",
    "removed_by": "removed by",
    # filters
    "filter": "filter", "value": "value", "threshold": "threshold",
    "cut_at": "where it cut", "removed_mass": "mass removed",
    "removed_count": "tokens removed", "kept_count": "tokens kept",
    # Compare's metrics
    "lane": "lane", "strategy": "strategy", "tokens": "tokens", "target_forwards": "target forwards",
    "tokens_per_forward": "tokens per target forward", "wall_s": "wall time (s)", "tokens_per_s": "tokens/s",
    "step_tokens_per_s": "tokens/s (steps' time)", "speedup_vs_greedy": "speed vs greedy (×)",
    "tau": "τ (tokens per verification)", "acceptance_rate": "acceptance rate",
    "first_divergence": "diverges at token", "stop_reason": "stop reason",
    # beam search
    "source_beam": "from beam", "logprob": "log p", "normalized_score": "score ÷ length penalty",
    "status": "status", "finished_at_step": "finished at step", "eos": "ends at EOS", "live_beams": "live beams",
    "best_live_piece": "best live token", "best_live_score": "best live score", "finished": "finished",
    "n_kept": "kept", "n_pruned": "pruned", "n_finished": "finished now", "n_finished_dropped": "finished, dropped",
    "n_eos_not_top": "EOS below top B", "early_stop": "early stop", "done": "done",
    # speculative decoding
    "k": "k (draft position)", "q_draft": "q draft", "p_target": "p target", "ratio": "p target ÷ q draft",
    "accept_prob": "acceptance probability", "sum_min": "Σmin(p,q)", "verdict": "verdict",
    "p_residual": "p residual", "round": "round",
    "drafter": "drafter", "gamma": "γ", "accepted": "accepted", "final_kind": "final token from",
    "final_piece": "final token", "emitted": "tokens emitted", "fed_tokens": "tokens fed",
    "kv_cropped_target": "KV rolled back (target)", "kv_cropped_draft": "KV rolled back (draft)",
    "gamma_reason": "why this γ", "tokens_verified": "tokens verified", "verify_ms": "verify (ms)",
    "draft_ms": "drafting (ms)", "acceptance_k": "acceptance of position γ (estimate)",
    "expected_tokens": "expected tokens", "round_ms": "round (ms)", "ms_per_token": "ms per token",
    # DSpark
    "parent": "parent", "cand": "candidate", "score": "ŝ", "V": "V (expected accepted)",
    "back": "best next candidate", "on_path": "on the chosen chain", "quantity": "quantity", "node": "node",
    "depth": "depth", "survival": "survival (∏ ŝ)", "p_accept": "acceptance probability", "source": "source",
    "prefill": "prefill", "select": "selection", "positions": "positions", "verified": "verified nodes",
    "next_from": "next token from", "next_piece": "next token", "expected_accepted": "expected accepted",
    "size": "size (chain length or tree nodes)", "lossy": "lossy", "phase": "phase", "share": "share of time",
    # calibration
    "bin": "ŝ bin", "mean_score": "mean ŝ", "acceptance": "acceptance", "samples": "samples",
    "hit_rate": "hit rate (top 4)", "ece_raw": "ECE raw", "ece_calibrated": "ECE calibrated",
    "a": "Platt a", "b": "Platt b",
    # acceptance and memory
    "rounds": "rounds", "rejected": "rejected", "not_reached": "not reached", "tokens_emitted": "tokens emitted",
    "tokens_held": "tokens held", "sequences": "sequences", "held_mb": "held (MB)", "peak_mb": "peak (MB)",
    "freed_mb": "freed (MB)",
    # Lab
    "forward": "forward", "n": "n", "measured_ms": "measured (ms)", "spread_ms": "spread (ms)", "repeats": "repeats",
    "roofline_ms": "roofline (ms)",
    "bound_by": "bound by", "gflop": "GFLOP", "mb_read": "read (MB)", "flop_per_byte": "FLOP per byte",
    "roofline_share": "roofline ÷ measured", "verify_ratio": "verify ÷ one-token forward",
    "tau_to_beat_greedy": "τ to beat greedy", "acceptance_needed": "acceptance needed", "how": "how",
    "batch": "batch", "throughput_vs_first": "throughput vs first (×)", "latency_p50_ms": "latency p50 (ms per token)",
    "latency_p99_ms": "latency p99 (ms per token)", "steps": "steps", "rule": "rule",
    "claims_lossless": "claims lossless", "tv_distance_exact": "TV distance (exact)", "tv_distance": "TV distance",
    "chi2": "χ²", "dof": "degrees of freedom", "p_value": "p-value",
    # What-if
    "expected_tokens_per_forward": "expected tokens per forward",
    "expected_acceptance_rate": "expected acceptance rate",
    "short_rounds": "rounds with fewer drafts", "expected_ms_per_token": "expected ms per token", "plan": "plan",
    "forecast_tokens_per_forward": "forecast tokens per forward",
    "replayed_tokens_per_forward": "replayed tokens per forward", "lower_bound_rounds": "rounds at a lower bound",
}


# Cells of a closed set of values, in words where the value is a name (a trace's verdicts, beam statuses and
# the filters that removed a candidate).
FILTER_WORDS = {"top_k": "top-k", "top_p": "top-p", "min_p": "min-p"}
STOP_WORDS = {"max_new_tokens": "token budget reached", "eos": "end of text (EOS)", "stopped": "stopped by you",
              "error": "error"}
# A step's timed phases (the trace's `timings_ms` keys; each strategy names its own) in words.
PHASE_WORDS = {"prefill": "prefill (the prompt)", "forward": "target forward", "processing": "logit processing",
               "sampling": "sampling", "draft": "drafting", "drafter": "drafting", "dp": "DP selection",
               "verify": "verification (target forward)", "verification": "verification (target forward)",
               "accept": "acceptance", "acceptance": "acceptance", "rollback": "KV rollback",
               "cache": "KV cache update", "other": "other (Python, bookkeeping)"}
VALUE_WORDS: dict[str, dict[str, str]] = {
    "verdict": {"not_reached": "not reached"}, "stop_reason": STOP_WORDS, "phase": PHASE_WORDS,
    "status": {status: style[-1] for status, style in STATUS_STYLE.items()},
    "removed_by": FILTER_WORDS, "filter": FILTER_WORDS,
}


def header(field: str, words: Mapping[str, str] | None = None) -> str:
    """The words a column named `field` shows: the table's own `words`, else HEADERS, else the name."""
    return (words or {}).get(field) or HEADERS.get(field, field)


def help_for(column: str) -> str | None:
    """A shown column's tooltip: its glossary definition (ui/views/glossary.py), else None."""
    return glossary.definition(column)


def value_word(field: str, value: str) -> str:
    """The words a cell of column `field` holding `value` shows (VALUE_WORDS), else the value itself."""
    return VALUE_WORDS.get(field, {}).get(value, value)


def _whole(column: pd.Series) -> bool:
    values = column.dropna()
    return column.dtype.kind == "f" and len(values) > 0 and bool((values == values.round()).all()) \
        and bool((values.abs() < 2 ** 53).all())


def shown(table: pd.DataFrame, words: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The table as the page shows it: columns in words; a float column of whole numbers (ids with a gap that
    does not apply, counts) as integers, its gaps missing, not NaN; verdicts and statuses in words."""
    table = table.assign(**{f: table[f].map(lambda v, f=f: value_word(f, v)) for f in VALUE_WORDS
                            if f in table.columns})
    out = table.rename(columns=lambda field: header(str(field), words))
    whole = [c for c in out.columns if _whole(out[c])]
    return out.astype(dict.fromkeys(whole, "Int64")) if whole else out


# Shares shown as percentages in every table, as the pages' metrics show them ("acceptance rate 40.0%").
PERCENT_FIELDS = ("acceptance_rate", "expected_acceptance_rate", "share", "hit_rate")
PERCENT_FORMAT = "percent"    # Streamlit's NumberColumn: 0.4 shows as 40.00%


def number_formats(table: pd.DataFrame) -> dict[str, str]:
    """Column -> format for a shown table: the shares of PERCENT_FIELDS as percentages, and printf for the
    float columns that hold a non-zero value below SMALL (a probability of 3.4e-05 shows as 0.000034, not
    0.00003 or 0); the other columns keep Streamlit's own format."""
    percent = {header(f) for f in PERCENT_FIELDS}
    out = {}
    for column in table.columns:
        values = table[column]
        if values.dtype.kind == "f" and column in percent:
            out[column] = PERCENT_FORMAT
        elif values.dtype.kind == "f" and ((values != 0) & (values.abs() < SMALL)).any():
            out[column] = SMALL_FORMAT
    return out
