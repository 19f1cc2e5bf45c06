"""`auto` is speculative decoding's default draft (as DSpark's drafter): the shipped feature drafter where it
was trained for the model, training-free sources elsewhere. Every speculative and DSpark run says which
sources ran and why: in its trace (`drafting`, schema 1.6 for speculative), in the CLI summary, and before
the run (decoding.runner.planned_drafting, what the app's sidebar shows)."""
from __future__ import annotations

import json

import pytest

from decoding import __main__ as cli
from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.trace import DraftingInfo, TraceFormatError, from_json, to_json
from decoding.drafters.factory import AUTO_FITS, AUTO_FREE, draft_sources, make_drafter
from decoding.runner import planned_drafting, run
from tests.dspark_helpers import varied_llama

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=3)


def test_auto_is_the_default_draft():
    assert SpeculativeConfig().draft == "auto" and DSparkConfig().drafter == "auto"


def test_the_default_run_records_its_training_free_sources_and_why(lm):
    trace = run(lm, PROMPT, SpeculativeConfig(max_new_tokens=12))
    assert trace.steps[0].drafting == DraftingInfo(("lookup", "recycling"), AUTO_FREE, "empty")
    assert all(step.drafting is None for step in trace.steps[1:])
    assert trace.output_ids == run(lm, PROMPT, GreedyConfig(max_new_tokens=12)).output_ids   # exact at T = 0
    assert from_json(to_json(trace)).steps[0].drafting == trace.steps[0].drafting


@pytest.mark.parametrize("draft,sources", [
    ("lookup", ("lookup",)), ("recycling+suffix", ("recycling", "suffix")),
    ("lookup+recycling", ("lookup", "recycling")),
    ("feature:x.safetensors", ("feature",)), ("lookup+shallow", ("lookup", "shallow")), ("some/model", ("model",)),
    ("lookup+some/model", ("lookup", "model"))])
def test_a_named_draft_records_its_sources_as_set(draft, sources):
    assert draft_sources(draft) == sources


def test_a_named_draft_run_says_it_was_set(lm):
    trace = run(lm, PROMPT, SpeculativeConfig(max_new_tokens=4, draft="lookup"))
    assert trace.steps[0].drafting == DraftingInfo(("lookup",), "draft 'lookup' as set")


def test_a_drafter_passed_in_is_named_by_its_sources(lm):
    trace = run(lm, PROMPT, SpeculativeConfig(max_new_tokens=4, draft="lookup"),
                drafter=make_drafter("lookup+recycling", lm))
    assert trace.steps[0].drafting == DraftingInfo(("lookup", "recycling"), "the drafter passed in")


@pytest.mark.parametrize("config", [SpeculativeConfig(max_new_tokens=4), SpeculativeConfig(max_new_tokens=4,
                                    draft="recycling"), DSparkConfig(max_new_tokens=4, cost_table=None),
                                    DSparkConfig(max_new_tokens=4, cost_table=None, drafter="suffix",
                                                 lookup_max_ngram=0)],
                         ids=["spec-auto", "spec-recycling", "dspark-auto", "dspark-suffix"])
def test_planned_drafting_is_what_the_run_records(lm, config):
    assert planned_drafting(lm, config) == run(lm, PROMPT, config).steps[0].drafting


def test_planned_drafting_is_none_without_drafting(lm):
    assert planned_drafting(lm, GreedyConfig()) is None


def test_planned_drafting_of_a_trained_drafter_loads_nothing(lm, tmp_path):
    """A trained drafter named by a file that does not exist: the plan names it, only the run loads it."""
    config = DSparkConfig(drafter=f"feature:{tmp_path / 'none.safetensors'}+recycling")
    assert planned_drafting(lm, config).sources == ("feature", "lookup", "recycling")


def test_the_cli_summary_says_which_sources_and_why(tmp_path, capsys):
    from word_models import PROMPT as WORDS
    from word_models import build_word_model_dir

    model = build_word_model_dir(tmp_path / "word")
    capsys.readouterr()
    assert cli.main(["run", "--model", str(model), "--prompt", WORDS, "--max-new-tokens", "3",
                     "--strategy", "speculative"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("[speculative] 3 tokens") and summary.endswith(
        f", sources lookup+recycling ({AUTO_FREE}), memory: empty")


def _spectrace_json(lm) -> dict:
    return json.loads(to_json(run(lm, PROMPT, SpeculativeConfig(max_new_tokens=4, draft="lookup"))))


def test_a_speculative_trace_of_1_5_loads_without_drafting(lm):
    data = _spectrace_json(lm)
    data["schema_version"] = "1.5"
    del data["steps"][0]["drafting"]
    assert from_json(json.dumps(data)).steps[0].drafting is None


def test_a_speculative_drafting_reason_over_the_limit_is_refused(lm):
    data = _spectrace_json(lm)
    data["steps"][0]["drafting"]["reason"] = "x" * 301
    with pytest.raises(TraceFormatError, match=r"steps\[0\]\.drafting\.reason: 301 characters"):
        from_json(json.dumps(data))


@pytest.mark.real
@pytest.mark.slow
def test_auto_on_the_embedded_model_drafts_with_the_shipped_feature_drafter(real_lm):
    ids = real_lm.encode("List the days of the week.", chat_template=True)
    config = SpeculativeConfig(max_new_tokens=6)
    trace = run(real_lm, ids, config)
    assert trace.steps[0].drafting == DraftingInfo(("lookup", "feature"), AUTO_FITS)
    assert planned_drafting(real_lm, config) == trace.steps[0].drafting
    assert any(step.drafter.endswith("[feature]") for step in trace.steps)
    assert trace.output_ids == run(real_lm, ids, GreedyConfig(max_new_tokens=6)).output_ids
