"""`auto` is speculative decoding's default draft (as DSpark's drafter): the shipped feature drafter where it
was trained for the model, training-free sources elsewhere. Every speculative and DSpark run says which
sources ran and why: in its trace (`drafting`, schema 1.6 for speculative), in the CLI summary, and before
the run (decoding.runner.planned_drafting, what the app's sidebar shows)."""
from __future__ import annotations

import json

import pytest
from dspark_helpers import varied_llama

from decoding import __main__ as cli
from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.draft_names import read_draft
from decoding.core.trace import DraftingInfo, TraceFormatError, from_json, to_json
from decoding.drafters.factory import AUTO_FITS, AUTO_FREE, make_drafter
from decoding.runner import planned_drafting, run

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
    assert read_draft(draft).trace_names == sources


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


def test_one_resolver_serves_both_strategies_and_the_caption():
    """speculative's and DSpark's decode and runner.planned_drafting (the sidebar's "resolves to") read names
    through one resolver (decoding.drafters.resolve)."""
    from decoding.drafters import resolve
    from decoding.runner import STRATEGIES
    from decoding.strategies import dspark, speculative

    assert speculative.resolve is dspark.resolve is resolve.resolve
    assert STRATEGIES["speculative"].drafting is STRATEGIES["dspark"].drafting is resolve.planned_drafting


@pytest.mark.parametrize("config", [SpeculativeConfig(), SpeculativeConfig(draft="recycling+suffix"),
                                    SpeculativeConfig(draft="lookup+recycling"), DSparkConfig(),
                                    DSparkConfig(drafter="recycling+suffix"), DSparkConfig(drafter="suffix",
                                                                                         lookup_max_ngram=0)],
                         ids=["spec-auto", "spec-free", "spec-lookup", "dspark-auto", "dspark-free", "dspark-suffix"])
def test_the_caption_names_the_sources_the_resolver_builds(lm, config):
    """The plan (nothing loaded) and the resolved sources agree, source by source, on the same name."""
    from decoding.drafters.resolve import resolve

    drafting = resolve(lm, config)
    assert planned_drafting(lm, config) == drafting.info
    names = [part.name for source in drafting.sources for part in source.parts]
    if isinstance(config, DSparkConfig) and config.lookup_max_ngram:
        assert names[0] == "lookup"              # prompt lookup's chain as the base (no trained drafter here)
    assert tuple(names) == drafting.info.sources


def test_drafter_means_a_source_in_both_strategies(lm):
    """drafter= takes a source in both decode()s: the run drafts with it as given and says so."""
    from decoding.drafters.recycling import RecyclingSource, RecyclingTable

    greedy = run(lm, PROMPT, GreedyConfig(max_new_tokens=8)).output_ids
    spec = run(lm, PROMPT, SpeculativeConfig(max_new_tokens=8), drafter=RecyclingSource(RecyclingTable(lm.vocab_size)))
    dspark = run(lm, PROMPT, DSparkConfig(max_new_tokens=8, cost_table=None, lookup_max_ngram=0),
                 drafter=RecyclingSource(RecyclingTable(lm.vocab_size)))
    with_lookup = run(lm, PROMPT, DSparkConfig(max_new_tokens=8, cost_table=None),
                      drafter=RecyclingSource(RecyclingTable(lm.vocab_size)))
    assert spec.steps[0].drafting == dspark.steps[0].drafting == DraftingInfo(("recycling",), "the drafter passed in")
    assert with_lookup.steps[0].drafting == DraftingInfo(("lookup", "recycling"), "the drafter passed in")
    assert spec.output_ids == dspark.output_ids == with_lookup.output_ids == greedy      # exact at T = 0
    assert any(cell.sources == ("recycling",) for step in dspark.steps for col in step.lattice for cell in col.cells)


def test_drafter_of_the_wrong_kind_is_one_line_naming_it(lm):
    from dspark_helpers import random_head

    from decoding.core.errors import ConfigError

    def error(config, drafter) -> str:
        try:
            return run(lm, PROMPT, config, drafter=drafter).error
        except ConfigError as err:
            return str(err)

    assert error(SpeculativeConfig(max_new_tokens=4), random_head(lm)) == (
        "drafter='FeatureLatticeDrafter' is invalid: cannot draft speculative decoding's chain: give a source, "
        "a draft model or a feature drafter")
    assert error(DSparkConfig(max_new_tokens=4, cost_table=None), lm) == (
        "drafter='LM' is invalid: is not a DSpark drafter: give a source, a parallel drafter or a feature head")
    from decoding.drafters.lattice_bases import TrainedSource
    from decoding.drafters.lookup import PromptLookupDrafter

    assert error(SpeculativeConfig(max_new_tokens=4), TrainedSource(random_head(lm))).startswith(
        "drafter='feature' is invalid: scores a DSpark lattice from the target's hidden rows")
    assert error(DSparkConfig(max_new_tokens=4, cost_table=None), PromptLookupDrafter()).startswith(
        "drafter='lookup' is invalid: draws speculative decoding's chains")


def test_a_trained_net_and_its_source_draft_alike_in_dspark(lm):
    """DSpark handed a trained net fills the name's trained part; handed the net's source, it drafts with that
    source as given: the same lattices and tokens, each trace saying which it was."""
    from dspark_helpers import random_head

    from decoding.drafters.lattice_bases import TrainedSource

    config = DSparkConfig(max_new_tokens=8, cost_table=None, gamma=3)
    net = run(lm, PROMPT, config, drafter=random_head(lm))
    source = run(lm, PROMPT, config, drafter=TrainedSource(random_head(lm)))
    assert net.steps[0].drafting == DraftingInfo(("feature", "lookup"), "auto: the drafter passed in")
    assert source.steps[0].drafting == DraftingInfo(("feature", "lookup"), "the drafter passed in")
    assert [s.lattice for s in net.steps] == [s.lattice for s in source.steps] and net.steps[1].lattice
    assert net.output_ids == source.output_ids


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
