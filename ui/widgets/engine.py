"""The widgets' one door to the engine's torch side: running a strategy (decoding/runner.py), the engine
thread, loading a model or a drafter, freeing device memory and the Lab's measurements.

Importing it loads no torch: each name below is imported from its engine module on first use (PEP 562), so
no widget or page loads torch by being imported (in the app, torch comes with app.py's start of the engine
thread). Callers write
`from ui.widgets import engine` and `engine.run(...)` where they use it; what loads no torch (the configs, the
trace and its totals, `ModelSpec` and its choices, the cost table, paths, files) they import from decoding/
directly. A new name is one line in `_LAZY`. tests/test_ui_no_torch.py holds the UI to both rules."""
from __future__ import annotations

import importlib

_LAZY = {   # name -> the engine module it comes from
    "RUN_ERRORS": "decoding.runner",
    "RunEnd": "decoding.runner",
    "assemble": "decoding.runner",
    "check_inputs": "decoding.runner",
    "error_line": "decoding.runner",
    "iterate": "decoding.runner",
    "planned_drafting": "decoding.runner",
    "run": "decoding.runner",
    "run_lockstep": "decoding.runner",
    "strategy_for": "decoding.runner",
    "ENGINE": "decoding.runtime.engine_thread",
    "threads_beside_ui": "decoding.runtime.engine_thread",
    "load": "decoding.runtime.models",
    "free_device_memory": "decoding.runtime.models",
    "load_draft": "decoding.drafters.factory",
    "measure_cost": "decoding.lab.forward_cost",
    "measure_lossless": "decoding.lab.lossless",
    "measure_queue": "decoding.lab.queue_live",
    "measure_throughput": "decoding.lab.throughput",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value            # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
