"""Strategy configs and a prompt shared by the tests that run several lanes at once (lockstep, the engine thread)."""
from __future__ import annotations

from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig

PROMPT = [5, 9, 13, 5, 9, 13, 5, 9, 13, 5, 9]


CONFIGS = {
    "greedy": GreedyConfig(max_new_tokens=20),
    "sample": SampleConfig(max_new_tokens=20, temperature=0.9, top_k=20, seed=3),
    "beam": BeamConfig(max_new_tokens=12, num_beams=3),
    "speculative": SpeculativeConfig(draft="lookup", max_new_tokens=20, gamma=3, temperature=0.8, seed=5),
    "dspark": DSparkConfig(max_new_tokens=20, gamma=4, temperature=0.7, seed=7),
}


def kwargs_for(name: str, drafter) -> dict:
    return {"drafter": drafter} if name == "dspark" else {}
