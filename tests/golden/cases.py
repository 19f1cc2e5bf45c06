"""The fixed runs whose traces are recorded in tests/golden/*.json: every strategy and drafter, greedy and
sampled, forced branches and a lockstep comparison, on the embedded model. Behaviour-preserving changes
(a refactor, a package move) must reproduce them apart from timing fields (tests/test_golden.py).

Re-record only when a change is meant to alter behaviour, and say so in its commit:
    .venv/bin/python -m tests.golden.cases            (about a minute on a 2-core CPU)
    .venv/bin/python -m tests.golden.cases NAME...    (only those cases; "lockstep" for lockstep.json)
Uses the public API of `decoding` alone, so that it outlives any move of the modules behind it."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
COST = str(HERE / "cost.json")        # a fixed verify-cost table: no timing may steer a recorded run
PROMPT = "List the days of the week, one per line."
FORCED = ("Sure", ",", " the")       # pieces encoded to ids at run time: a forced branch from step 0
# The parallel drafter's cases keep the settings they were recorded with, DSpark's defaults until the
# sequential head replaced them ("default" is the parallel drafter's older name, as in those traces).
PARALLEL = {"drafter": "default", "top_k_candidates": 2, "select": "chain", "budget": 16, "lookup_max_ngram": 0,
            "cost_table": "none"}


@dataclass(frozen=True)
class Case:
    name: str
    strategy: str
    params: dict = field(default_factory=dict)
    forced: bool = False
    max_new_tokens: int = 20


CASES = (
    Case("greedy", "greedy"),
    Case("greedy_forced", "greedy", forced=True),
    Case("sample", "sample", {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.02, "seed": 3}),
    Case("beam", "beam", {"num_beams": 3, "length_penalty": 0.8}),
    Case("spec_lookup", "speculative", {"draft": "lookup", "gamma": 4}),
    Case("spec_lookup_sampled", "speculative", {"draft": "lookup", "gamma": 3, "temperature": 0.9, "seed": 5}),
    Case("spec_shallow", "speculative", {"draft": "shallow", "gamma": 3}),
    Case("spec_shallow_sampled", "speculative", {"draft": "shallow", "gamma": 3, "temperature": 0.7, "top_k": 20}),
    Case("spec_feature", "speculative", {"draft": "feature", "gamma": 4, "gamma_max": 6}),
    Case("spec_feature_sampled", "speculative", {"draft": "feature", "gamma": 4, "temperature": 1.0, "seed": 2}),
    Case("spec_lookup_feature", "speculative", {"draft": "lookup+feature", "gamma": 5,
                                                "gamma_policy": "heuristic"}),
    Case("spec_confidence", "speculative", {"draft": "feature", "gamma": 6, "gamma_policy": "confidence",
                                            "confidence_threshold": 0.3}),
    Case("spec_cost", "speculative", {"draft": "lookup", "gamma": 8, "gamma_policy": "cost", "cost_table": COST}),
    Case("spec_forced", "speculative", {"draft": "feature", "gamma": 3}, forced=True),
    Case("dspark_chain", "dspark", {**PARALLEL, "gamma": 8}),
    Case("dspark_tree", "dspark", {**PARALLEL, "gamma": 6, "select": "tree", "budget": 10, "top_k_candidates": 3}),
    Case("dspark_sampled", "dspark", {**PARALLEL, "gamma": 6, "temperature": 0.8, "seed": 4}),
    Case("dspark_tree_sampled", "dspark", {**PARALLEL, "select": "tree", "budget": 8, "temperature": 1.0, "seed": 1}),
    Case("dspark_lookup_cost", "dspark", {**PARALLEL, "gamma": 8, "lookup_max_ngram": 2, "cost_table": COST}),
    Case("dspark_tree_cost", "dspark", {**PARALLEL, "select": "tree", "budget": 16, "cost_table": COST}),
    Case("dspark_lossy", "dspark", {**PARALLEL, "gamma": 5, "temperature": 1.0, "lossy_threshold": 0.5, "seed": 6}),
    Case("dspark_forced", "dspark", {**PARALLEL, "gamma": 6}, forced=True),
    Case("dspark_head", "dspark", {"cost_table": COST}),          # the defaults, with a fixed table for "auto"
    Case("dspark_head_fixed", "dspark", {"cost_table": "none"}),
    Case("dspark_head_sampled", "dspark", {"temperature": 0.8, "seed": 2, "cost_table": COST}),
    Case("dspark_head_chain_cost", "dspark", {"select": "chain", "cost_table": COST}),
)
LOCKSTEP = ("greedy", "spec_lookup", "dspark_chain")   # also recorded side by side as lockstep.json


def config_of(case: Case):
    from decoding import STRATEGIES

    params = {"max_new_tokens": case.max_new_tokens, "top_n": 5, **case.params}
    return STRATEGIES[case.strategy].config_cls(**params)


def kwargs_of(config, lm) -> dict:
    from decoding import load_draft

    draft = getattr(config, "draft_model", None)
    return {"drafter": load_draft(draft, lm)} if config.strategy == "speculative" and draft else {}


def forced_ids(lm) -> list[int]:
    return [i for piece in FORCED for i in lm.tokenizer.encode(piece, add_special_tokens=False)]


def record_case(lm, case: Case):
    from decoding import run

    config = config_of(case)
    ids = lm.encode(PROMPT, chat_template=True)
    forced = forced_ids(lm) if case.forced else ()
    return run(lm, ids, config, prompt_text=PROMPT, forced=forced, **kwargs_of(config, lm))


def record_lockstep(lm):
    from decoding import run_lockstep

    by_name = {c.name: c for c in CASES}
    lanes = {}
    for name in LOCKSTEP:
        config = config_of(by_name[name])
        lanes[name] = (config, kwargs_of(config, lm))
    return run_lockstep(lm, lm.encode(PROMPT, chat_template=True), lanes, prompt_text=PROMPT)


def main(names: list[str]) -> int:
    """Record every case and the lockstep comparison, or only the cases (and "lockstep") named."""
    from decoding import ModelSpec, load, to_json

    lm = load(ModelSpec())
    for case in CASES:
        if names and case.name not in names:
            continue
        trace = record_case(lm, case)
        (HERE / f"{case.name}.json").write_text(to_json(trace), encoding="utf-8")
        print(f"{case.name}: {trace.stats.new_tokens} tokens, {trace.stats.target_forwards} forwards")
    if names and "lockstep" not in names:
        return 0
    traces = record_lockstep(lm)
    (HERE / "lockstep.json").write_text("[" + ",".join(to_json(t) for t in traces.values()) + "]",
                                        encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
