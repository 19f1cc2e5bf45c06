"""DecodeScope engine: step-wise decoding strategies that emit typed traces.

The public API, importable from `decoding` itself (loaded on first use, so that importing the light
modules, e.g. the trace contract, does not pull in torch):

    load(ModelSpec(...)) -> LM                     the target model
    run(lm, prompt_ids, config) -> Trace           one strategy to completion
    run_lockstep(lm, prompt_ids, lanes) -> {label: Trace}   several strategies step by step
    GreedyConfig, SampleConfig, BeamConfig, SpeculativeConfig, DSparkConfig
    Trace, to_json, from_json, without_timings     the trace contract (docs/trace-format.md)
    ConfigError                                    bad input, one line naming the parameter
    load_draft(name, target) -> draft               speculative decoding's draft model or drafter net
    SourceMemory()                                 what token recycling / suffix matching learn; pass it as
                                                   run(..., memory=) to share it across runs (default: none)

Never imports streamlit, plotly or pandas.
"""
from __future__ import annotations

import importlib

from decoding.core.errors import ConfigError

_LAZY = {
    "load": "decoding.runtime.models", "ModelSpec": "decoding.runtime.model_spec", "LM": "decoding.runtime.models",
    "run": "decoding.runner", "run_lockstep": "decoding.runner", "STRATEGIES": "decoding.runner",
    "GreedyConfig": "decoding.core.config", "SampleConfig": "decoding.core.config",
    "BeamConfig": "decoding.core.config",
    "SpeculativeConfig": "decoding.core.config", "DSparkConfig": "decoding.core.config",
    "Trace": "decoding.core.trace", "to_json": "decoding.core.trace", "from_json": "decoding.core.trace",
    "without_timings": "decoding.core.trace", "load_draft": "decoding.drafters.factory",
    "SourceMemory": "decoding.drafters.memory",
}

__all__ = ["ConfigError", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'decoding' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
