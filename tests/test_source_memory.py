"""What token recycling and suffix matching learn lives in the memory a run is given, never in the model: two
runs on one loaded model (two users of one server) share nothing unless the caller hands both the same
SourceMemory, and each trace says what its run started from. The negative control hands the second run the
first one's memory and sees the first run's text proposed."""
from __future__ import annotations

import pytest
from dspark_helpers import one_thread, varied_llama

from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.drafters.memory import SourceMemory
from decoding.runner import run

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
PROBE = [40, 41, 11, 12]                   # the second user's prompt
SECRET = (50, 51, 52, 53)                  # in the first user's prompt, right after the probe's own text
SUFFIX_ONLY = {"drafter": "suffix", "cost_table": None, "lookup_max_ngram": 0, "select": "tree", "budget": 8}


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=5)


def proposed(trace) -> set[int]:
    """Every token a drafting source proposed in the run (DSpark lattice cells and plan nodes, speculative
    drafts)."""
    steps = trace.steps
    return ({c.token_id for e in steps for col in getattr(e, "lattice", ()) for c in col.cells}
            | {n.token_id for e in steps for n in getattr(e, "nodes", ())}
            | {d.token_id for e in steps for d in getattr(e, "drafts", ())})


def first_user(lm, memory=None):
    """A prompt holding the probe's own start and first answer token, then the secret: a memory that saw it
    matches the probe's context (speculative: its end 11, 12; DSpark, a token later: 12, g) and proposes
    what followed."""
    g = run(lm, PROBE, GreedyConfig(max_new_tokens=1)).output_ids[0]
    prompt = [30, 31, 11, 12, g, *SECRET]
    return run(lm, prompt, DSparkConfig(max_new_tokens=8, **SUFFIX_ONLY), memory=memory)


@pytest.mark.parametrize("config", [DSparkConfig(max_new_tokens=4, **SUFFIX_ONLY),
                                    SpeculativeConfig(max_new_tokens=4, draft="suffix", gamma=4)],
                         ids=["dspark", "speculative"])
def test_a_second_run_on_the_same_model_sees_nothing_of_the_first(lm, config):
    first_user(lm)
    trace = run(lm, PROBE, config)
    own = set(PROBE) | set(trace.output_ids)
    assert trace.error is None and proposed(trace) <= own, proposed(trace) - own
    drafting = trace.steps[0].drafting
    assert drafting.memory == "empty"


@pytest.mark.parametrize("config", [DSparkConfig(max_new_tokens=4, **SUFFIX_ONLY),
                                    SpeculativeConfig(max_new_tokens=4, draft="suffix", gamma=4)],
                         ids=["dspark", "speculative"])
def test_negative_control_a_shared_memory_proposes_the_first_users_text(lm, config):
    shared = SourceMemory()
    first_user(lm, shared)
    trace = run(lm, PROBE, config, memory=shared)
    assert SECRET[0] in proposed(trace)          # what followed in the first user's prompt
    assert trace.steps[0].drafting.memory == "1 earlier run"
    assert trace.output_ids == run(lm, PROBE, GreedyConfig(max_new_tokens=4)).output_ids   # still exact


def test_the_recycling_table_holds_only_what_its_own_runs_fed(lm):
    config = DSparkConfig(max_new_tokens=6, drafter="recycling", cost_table=None)
    run(lm, [*SECRET, 54, 55], config)                       # another user's run, its own memory
    mine = SourceMemory()
    trace = run(lm, PROBE, config, memory=mine)
    fed = set(PROBE) | set(trace.output_ids) | {n.token_id for e in trace.steps for n in e.nodes}
    table = mine.recycling_table(lm.vocab_size)
    rows = {t for t in range(lm.vocab_size) if table.children(t, 1)}
    assert rows and rows <= fed and not rows & set(SECRET)


def test_a_memory_carries_over_only_on_the_model_that_filled_it(lm):
    memory = SourceMemory()
    config = DSparkConfig(max_new_tokens=4, drafter="recycling+suffix", cost_table=None)
    assert run(lm, PROBE, config, memory=memory).steps[0].drafting.memory == "empty"
    assert run(lm, PROBE, config, memory=memory).steps[0].drafting.memory == "1 earlier run"
    assert run(lm, PROBE, config, memory=memory).steps[0].drafting.memory == "2 earlier runs"
    other = varied_llama(seed=6)
    assert run(other, PROBE, config, memory=memory).steps[0].drafting.memory == "empty"
    assert memory.suffix_store().tokens == len(PROBE) + 4    # the first model's text is gone


def test_a_run_without_training_free_sources_records_no_memory(lm):
    trace = run(lm, PROBE, SpeculativeConfig(max_new_tokens=4, draft="lookup", gamma=3))
    assert trace.steps[0].drafting.memory == ""


def test_a_copy_is_independent(lm):
    memory = SourceMemory()
    first_user(lm, memory)
    copy = memory.copy()
    tokens = memory.suffix_store().tokens
    run(lm, PROBE, DSparkConfig(max_new_tokens=4, **SUFFIX_ONLY), memory=copy)
    assert memory.suffix_store().tokens == tokens and copy.suffix_store().tokens > tokens
    assert copy.runs == 2 and memory.runs == 1


def test_a_trace_older_than_1_7_cannot_carry_the_memory(lm):
    import json

    from decoding.core.trace import TraceFormatError, from_json, to_json

    data = json.loads(to_json(run(lm, PROBE, DSparkConfig(max_new_tokens=3, **SUFFIX_ONLY))))
    assert data["steps"][0]["drafting"]["memory"] == "empty"
    assert from_json(json.dumps(data)).steps[0].drafting.memory == "empty"
    data["schema_version"] = "1.6"
    with pytest.raises(TraceFormatError, match=r"drafting\.memory: is a field of schema 1\.7"):
        from_json(json.dumps(data))
    data["steps"][0]["drafting"]["memory"] = ""                # as a 1.6 writer left it: loads
    assert from_json(json.dumps(data)).steps[0].drafting.memory == ""
