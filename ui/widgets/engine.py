"""The widgets' one door to the engine's torch side: running a strategy (decoding/runner.py), the engine
thread, loading a model or a drafter, device placement and the Lab's measurements. Every other module of
ui/widgets/, app.py and app_pages/ import from decoding/ only what loads no torch (the configs, the trace,
its totals, the cost table, paths, files); tests/test_ui_no_torch.py holds them to it."""
from __future__ import annotations

from decoding.drafters.factory import load_draft
from decoding.lab.forward_cost import measure_cost
from decoding.lab.lossless import measure_lossless
from decoding.lab.queue_live import measure_queue
from decoding.lab.throughput import measure_throughput
from decoding.runner import (
    RUN_ERRORS,
    RunEnd,
    assemble,
    check_inputs,
    error_line,
    iterate,
    planned_drafting,
    run,
    run_lockstep,
    strategy_for,
)
from decoding.runtime.engine_thread import ENGINE, threads_beside_ui
from decoding.runtime.models import DEVICES, DTYPES, ModelSpec, free_device_memory, load
from decoding.runtime.placement import DEVICE_MAPS

__all__ = ["DEVICES", "DEVICE_MAPS", "DTYPES", "ENGINE", "RUN_ERRORS", "ModelSpec", "RunEnd", "assemble",
           "check_inputs", "error_line", "free_device_memory", "iterate", "load", "load_draft", "measure_cost",
           "measure_lossless", "measure_queue", "measure_throughput", "planned_drafting", "run", "run_lockstep",
           "strategy_for", "threads_beside_ui"]
