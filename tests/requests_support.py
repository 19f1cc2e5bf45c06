"""A request log like `python -m decoding serve` writes (decoding/serve/trace_log.py's record), built from
the tour's shipped traces with made-up timings: greedy requests slow, speculative and DSpark faster."""
from __future__ import annotations

import json
from pathlib import Path

TOUR = Path(__file__).resolve().parents[1] / "assets" / "tour"
STRATEGIES = ("greedy", "speculative", "dspark")


def timing(n: int, strategy: int) -> dict:
    """Request n of the strategy at index `strategy`: queue grows with n, decoding shorter per strategy."""
    queue = 0.05 * n
    gaps = [0.04 / (1 + strategy)] * 5
    return {"queue_s": queue, "ttft_s": queue + 0.06, "itl_s": gaps, "e2e_s": queue + 0.06 + sum(gaps)}


def record(n: int, strategy: int) -> dict:
    name = STRATEGIES[strategy]
    trace = json.loads((TOUR / f"{name}.json").read_text())
    return {"id": f"cmpl-{n:024x}", "model": "tiny", "strategy": name, "finish_reason": "length",
            "prompt_tokens": len(trace["prompt_ids"]), "completion_tokens": len(trace["output_ids"]),
            "arrived_unix_s": 1.0e9 + n, "timing": timing(n, strategy), "trace": trace}


def log_files(count: int = 9) -> list[tuple[str, bytes, str]]:
    """(name, bytes, mime) per record, as the app's uploader takes them."""
    return [(f"{n:020d}-cmpl.json", json.dumps(record(n, n % 3)).encode(), "application/json")
            for n in range(count)]


def served(strategy: str, e2e: float, queue: float = 0.0, ttft: float | None = 0.01, gaps=(0.01,),
           rounds=()):
    """One ui.views.requests.Served row made by hand."""
    from ui.views import requests as rq

    return rq.Served("t", f"cmpl-{int(e2e * 1e6):x}", strategy, "stop", 3, queue, ttft, tuple(gaps), e2e,
                     tuple(rounds))
