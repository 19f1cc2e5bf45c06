"""Trace JSON: round trip of every event type, -inf as null, versioning, and refusal of bad files."""
import json
import math

import pytest

from decoding import runner
from decoding.core import trace
from decoding.core.config import GreedyConfig, SampleConfig
from decoding.core.trace import TraceFormatError


@pytest.fixture(scope="module")
def sample_trace(tiny_lm):
    cfg = SampleConfig(max_new_tokens=6, temperature=0.8, top_k=10, top_p=0.9, min_p=0.02, seed=3)
    return runner.run(tiny_lm, [1, 2, 3], cfg)


def test_round_trip_equal(sample_trace, tiny_lm):
    text = trace.to_json(sample_trace)
    assert trace.from_json(text) == sample_trace
    greedy = runner.run(tiny_lm, [4, 5], GreedyConfig(max_new_tokens=4))
    assert trace.from_json(trace.to_json(greedy)) == greedy


def test_top_level_contract(sample_trace):
    data = json.loads(trace.to_json(sample_trace))
    for key in ("schema_version", "strategy", "config", "prompt_ids", "output_ids", "text", "steps", "stats"):
        assert key in data
    for key in ("new_tokens", "target_forwards", "wall_s", "tokens_per_s"):
        assert key in data["stats"]
    assert data["stats"]["new_tokens"] == len(data["output_ids"]) == 6
    assert data["stats"]["target_forwards"] == 6
    assert data["config"]["strategy"] == "sample" and data["config"]["top_k"] == 10


def test_neg_inf_written_as_null_and_read_back(sample_trace):
    text = trace.to_json(sample_trace)
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text)  # strict JSON
    removed = [c for s in sample_trace.steps for c in s.processed_top if c.removed_by]
    assert removed, "test needs a removed candidate"
    assert all(c.logit == -math.inf for c in removed)
    back = trace.from_json(text)
    back_removed = [c for s in back.steps for c in s.processed_top if c.removed_by]
    assert all(c.logit == -math.inf for c in back_removed)


def _mutate(sample_trace, fn):
    data = json.loads(trace.to_json(sample_trace))
    fn(data)
    return json.dumps(data)


@pytest.mark.parametrize("fn,needle", [
    (lambda d: d.pop("steps"), "steps"),
    (lambda d: d.pop("prompt_ids"), "prompt_ids"),
    (lambda d: d.update(schema_version="2.0"), "schema_version"),
    (lambda d: d.update(schema_version="one"), "schema_version"),
    (lambda d: d["steps"][0].update(kind="mystery"), "kind"),
    (lambda d: d["steps"][0].update(chosen_id="x"), "chosen_id"),
    (lambda d: d["steps"][0].pop("draw"), "draw"),
    (lambda d: d["steps"][1]["raw_top"][0].update(prob="high"), "prob"),
    (lambda d: d.update(output_ids=[1, -5]), "output_ids"),
    (lambda d: d.update(surprise=1), "unknown field"),
    (lambda d: d["stats"].update(new_tokens=True), "new_tokens"),
])
def test_malformed_refused_with_message(sample_trace, fn, needle):
    with pytest.raises(TraceFormatError) as err:
        trace.from_json(_mutate(sample_trace, fn))
    assert needle in str(err.value)


def test_not_json_and_not_object():
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        trace.from_json("{nope")
    with pytest.raises(TraceFormatError, match="JSON object"):
        trace.from_json("[1, 2]")


def test_out_of_range_token_ids(sample_trace):
    text = _mutate(sample_trace, lambda d: d.update(output_ids=[1, 999]))
    with pytest.raises(TraceFormatError, match=r"output_ids\[1\]=999"):
        trace.from_json(text, vocab_size=64)
    with pytest.raises(TraceFormatError, match=r"output_ids\[1\]=999.*64 tokens"):
        trace.from_json(text)  # the trace's own model's vocabulary applies
    def unknown_vocabulary(d):           # token 999 emitted by step 1, and no vocabulary recorded
        d["output_ids"][1] = d["steps"][1]["chosen_id"] = 999
        d["model"].pop("vocab_size")
    assert trace.from_json(_mutate(sample_trace, unknown_vocabulary)).output_ids[1] == 999


def test_oversized_refused(monkeypatch, sample_trace):
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 100)
    with pytest.raises(TraceFormatError, match="limit"):
        trace.from_json(trace.to_json(sample_trace))


def test_newer_minor_version_with_extra_fields_loads(sample_trace):
    def newer(d):
        d["schema_version"] = "1.99"
        d["future_field"] = {"x": 1}
        d["steps"][0]["future_step_field"] = 3
    back = trace.from_json(_mutate(sample_trace, newer))
    assert back.output_ids == sample_trace.output_ids


def test_older_trace_without_optional_fields_loads(sample_trace):
    def older(d):
        d["stats"].pop("acceptance_rate")
        d.pop("error")
        for s in d["steps"]:
            s.pop("forced")
    back = trace.from_json(_mutate(sample_trace, older))
    assert back.stats.acceptance_rate is None and back.error is None


def test_without_timings_drops_only_timing_fields(sample_trace):
    plain = trace.without_timings(sample_trace)
    assert "timings_ms" not in plain["steps"][0] and "wall_s" not in plain["stats"]
    assert plain["output_ids"] == list(sample_trace.output_ids)
