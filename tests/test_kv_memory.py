"""The KV cache's size in every step event (schema 1.3): the recorded bytes against the model's shape
(2 · layers · key/value width · bytes per element per token held), beam search's B-fold cache, the peak
of a speculative or DSpark round and what its rollback freed against the positions it cropped, and
loading: a 1.2 trace without the field still loads, a record whose freed bytes do not add up is refused."""
from __future__ import annotations

import dataclasses
import json

import pytest
from dspark_helpers import one_thread

from decoding import from_json, to_json
from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.trace import KVMemory, TraceFormatError
from decoding.lab.forward_cost import model_shape
from decoding.runner import run

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
PROMPT = [9, 40, 17, 9, 40, 17, 9, 40]


@pytest.fixture(scope="module")
def per_token(lm):
    return model_shape(lm).kv_bytes_per_token


def test_greedy_records_the_cache_after_each_forward(lm, per_token):
    trace = run(lm, PROMPT, GreedyConfig(max_new_tokens=6))
    for i, step in enumerate(trace.steps):
        assert step.kv == KVMemory(bytes=(len(PROMPT) + i) * per_token, tokens=len(PROMPT) + i, sequences=1)


@pytest.mark.parametrize("beams", [2, 4])
def test_beam_search_holds_b_times_greedy(lm, per_token, beams):
    greedy = run(lm, PROMPT, GreedyConfig(max_new_tokens=5))
    beam = run(lm, PROMPT, BeamConfig(max_new_tokens=5, num_beams=beams))
    for g, b in zip(greedy.steps, beam.steps):
        if b.done:
            break                                  # the last step does not grow the cache for a next one
        assert b.kv.sequences == beams and b.kv.tokens == g.kv.tokens
        assert b.kv.bytes == beams * g.kv.bytes


def test_speculative_peak_and_rollback(lm, per_token):
    trace = run(lm, PROMPT, SpeculativeConfig(draft="lookup", gamma=4, max_new_tokens=24))
    assert any(r.kv_cropped_target for r in trace.steps)            # some round rolled back
    held = 0
    for r in trace.steps:
        assert r.kv.bytes == r.kv.tokens * per_token
        assert r.kv.freed_bytes == r.kv_cropped_target * per_token
        assert r.kv.peak_bytes == held + r.fed_tokens * per_token   # the cache before, plus the forward's tokens
        held = r.kv.bytes


def test_dspark_peak_and_compaction(lm, per_token):
    from dspark_helpers import random_head

    trace = run(lm, PROMPT, DSparkConfig(max_new_tokens=24, gamma=4, top_k_candidates=3, budget=8),
                drafter=random_head(lm))
    prefill, *rounds = trace.steps
    assert prefill.kv == KVMemory(bytes=len(PROMPT) * per_token, tokens=len(PROMPT))
    held = prefill.kv.bytes
    for r in rounds:
        assert r.kv.peak_bytes == held + r.fed_tokens * per_token     # the whole tree, root included
        assert r.kv.bytes == held + (1 + len(r.accepted_path)) * per_token   # the root and the accepted path
        held = r.kv.bytes
    assert any(r.kv.freed_bytes > 0 for r in rounds)


def test_the_record_survives_json_and_older_traces_load_without_it(lm):
    trace = run(lm, PROMPT, GreedyConfig(max_new_tokens=3))
    assert from_json(to_json(trace)).steps == trace.steps
    data = json.loads(to_json(trace))
    data["schema_version"] = "1.2"
    for step in data["steps"]:
        del step["kv"]
    old = from_json(json.dumps(data))
    assert [s.kv for s in old.steps] == [None] * 3
    assert [dataclasses.replace(s, kv=None) for s in trace.steps] == list(old.steps)


@pytest.mark.parametrize(("change", "words"), [
    ({"freed_bytes": 5}, "is not peak_bytes - bytes"),
    ({"bytes": -1, "freed_bytes": 0, "peak_bytes": None}, "is not a size"),
    ({"peak_bytes": None}, "needs peak_bytes"),
])
def test_a_record_that_does_not_add_up_is_refused(lm, change, words):
    trace = run(lm, PROMPT, SpeculativeConfig(draft="lookup", gamma=4, max_new_tokens=12))
    data = json.loads(to_json(trace))
    step = next(s for s in data["steps"] if s["kv"]["freed_bytes"])
    step["kv"].update(change)
    with pytest.raises(TraceFormatError, match=words):
        from_json(json.dumps(data))
