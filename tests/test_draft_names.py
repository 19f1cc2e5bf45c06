"""One drafter-name grammar for both strategies (decoding.core.draft_names; docs/drafters.md "Drafter names"):
every documented form read by speculative decoding's `draft` and DSpark's `drafter`, the parts a strategy
refuses in one line naming the parameter and the name, and one point where both resolve their drafter (the
decode call, before the first event)."""
from __future__ import annotations

import re

import pytest
import torch
from dspark_helpers import varied_llama

from decoding.core.config import DSparkConfig, SpeculativeConfig
from decoding.core.draft_names import DraftSpec, read_draft, read_drafter
from decoding.core.errors import ConfigError
from decoding.runner import STRATEGIES, run, run_lockstep


def parts(spec: DraftSpec) -> str:
    """A spec in words: 'auto', or 'lookup', 'load:KIND(ARG)' for the part to load, 'tree:KIND(ARG)' per source."""
    def word(part):
        return part.kind if not part.arg else f"{part.kind}({part.arg})"
    if spec.auto:
        return "auto"
    loaded = [f"load:{word(spec.trained)}"] if spec.trained is not None else []
    return " ".join(["lookup"] * spec.lookup + loaded + [f"tree:{word(part)}" for part in spec.sources])


# name -> (what speculative decoding's draft reads, what DSpark's drafter reads); "!" + a message: refused
LOOKUP_NOT_DSPARK = "!prompt lookup is DSpark's lookup_max_ngram, not a drafter part"
PARALLEL_NOT_SPEC = "!the parallel drafter drafts DSpark's lattice, not speculative decoding's chain"
SHALLOW_NOT_DSPARK = "!the shallow self-draft drafts speculative decoding's chain only"
LOAD_OR_TREE = "!names one drafter to load or training-free sources (recycling, suffix), not both"
GRAMMAR = {
    "auto": ("auto", "auto"),
    "lookup": ("lookup", LOOKUP_NOT_DSPARK),
    "recycling": ("tree:recycling", "tree:recycling"),
    "suffix": ("tree:suffix", "tree:suffix"),
    "recycling+suffix": ("tree:recycling tree:suffix", "tree:recycling tree:suffix"),
    "lookup+recycling": ("lookup tree:recycling", LOOKUP_NOT_DSPARK),
    "lookup+recycling+suffix": ("lookup tree:recycling tree:suffix", LOOKUP_NOT_DSPARK),
    "feature": ("load:feature", "load:feature"),
    "feature:": ("load:feature", "load:feature"),
    "feature:f.safetensors": ("load:feature(f.safetensors)", "load:feature(f.safetensors)"),
    "feature:/m/a+b.safetensors": ("load:feature(/m/a+b.safetensors)", "load:feature(/m/a+b.safetensors)"),
    "lookup+feature": ("lookup load:feature", LOOKUP_NOT_DSPARK),
    "lookup+feature:f.safetensors": ("lookup load:feature(f.safetensors)", LOOKUP_NOT_DSPARK),
    "shallow": ("load:shallow", SHALLOW_NOT_DSPARK),
    "shallow:s.safetensors": ("load:shallow(s.safetensors)", SHALLOW_NOT_DSPARK),
    "lookup+shallow": ("lookup load:shallow", LOOKUP_NOT_DSPARK),
    "parallel": (PARALLEL_NOT_SPEC, "load:parallel"),
    "parallel:p.safetensors": (PARALLEL_NOT_SPEC, "load:parallel(p.safetensors)"),
    "parallel:p.safetensors+recycling+suffix": (PARALLEL_NOT_SPEC,
                                                "load:parallel(p.safetensors) tree:recycling tree:suffix"),
    # bare names: a draft model for speculative decoding, a parallel drafter's file for DSpark
    "default": ("load:model(default)", "load:parallel"),
    "default+recycling": (LOAD_OR_TREE, "load:parallel tree:recycling"),
    "some/model": ("load:model(some/model)", "load:parallel(some/model)"),
    "/m/a+b": ("load:model(/m/a+b)", "load:parallel(/m/a+b)"),
    "/m/a+b.safetensors+suffix": (LOAD_OR_TREE, "load:parallel(/m/a+b.safetensors) tree:suffix"),
    "lookup+some/model": ("lookup load:model(some/model)", LOOKUP_NOT_DSPARK),
    "lookup+/m/a+b": ("lookup load:model(/m/a+b)", LOOKUP_NOT_DSPARK),
    "model": ("load:model(model)", "load:parallel(model)"),
    # model:ID, the explicit prefix: the draft model to load (speculative), a tree source (DSpark)
    "model:some/model": ("load:model(some/model)", "tree:model(some/model)"),
    "lookup+model:some/model": ("lookup load:model(some/model)", LOOKUP_NOT_DSPARK),
    "model:/m/a+b": ("load:model(/m/a+b)", "tree:model(/m/a+b)"),
    "model:/m/a+b+recycling": (LOAD_OR_TREE, "tree:model(/m/a+b) tree:recycling"),
    "recycling+model:m": (LOAD_OR_TREE, "tree:recycling tree:model(m)"),
    # composed: a trained drafter first, then tree sources (DSpark)
    "feature+recycling": (LOAD_OR_TREE, "load:feature tree:recycling"),
    "feature+model:/m/a+b+recycling": ("!names more than one drafter to load",
                                       "load:feature tree:model(/m/a+b) tree:recycling"),
    "feature:f.safetensors+suffix": (LOAD_OR_TREE, "load:feature(f.safetensors) tree:suffix"),
}
# names refused by both, or by one with a message of its own: (param, name, message)
REFUSED = [
    ("draft", "lookup+", "give a draft model after 'lookup+' (e.g. 'lookup+shallow')"),
    ("draft", "lookup+auto", "give a draft model after 'lookup+' (e.g. 'lookup+shallow')"),
    ("draft", "lookup+lookup", "give a draft model after 'lookup+' (e.g. 'lookup+shallow')"),
    ("draft", "recycling+lookup", "prompt lookup goes first ('lookup+…')"),
    ("draft", "feature+shallow", "names more than one drafter to load"),
    ("draft", "model:a+model:b", "names more than one drafter to load"),
    ("drafter", "recycling+feature", "names one trained drafter, first (e.g. 'feature+recycling')"),
    ("drafter", "feature+parallel", "names one trained drafter, first (e.g. 'feature+recycling')"),
    ("drafter", "model:a+recycling+model:b", "names more than one draft model (model:ID)"),
    *[(param, name, message) for param in ("draft", "drafter") for name, message in [
        ("auto+recycling", "'auto' stands alone (it picks the sources by the model)"),
        ("recycling+auto", "'auto' stands alone (it picks the sources by the model)"),
        ("recycling+recycling", "names a source twice"),
        ("model:", "has an empty part (give an id or a file after 'model:', a name between '+')"),
        ("recycling+", "has an empty part (give an id or a file after 'model:', a name between '+')"),
        ("+recycling", "has an empty part (give an id or a file after 'model:', a name between '+')")]],
]
READ = {"draft": read_draft, "drafter": read_drafter}
CONFIG = {"draft": SpeculativeConfig, "drafter": DSparkConfig}


def read(param: str, name: str) -> str:
    try:
        return parts(READ[param](name))
    except ConfigError as err:
        assert str(err) == f"{param}={name!r} is invalid: {err.expected}" and "\n" not in str(err)
        return "!" + err.expected


@pytest.mark.parametrize("name", GRAMMAR)
def test_every_documented_name_reads_the_same_in_both_strategies_grammar(name):
    assert (read("draft", name), read("drafter", name)) == GRAMMAR[name]


@pytest.mark.parametrize("param,name,message", REFUSED, ids=[f"{p}={n}" for p, n, _ in REFUSED])
def test_a_part_a_strategy_cannot_use_is_refused_in_one_line(param, name, message):
    assert read(param, name) == "!" + message
    with pytest.raises(ConfigError) as made:                     # the config refuses it as it is made
        CONFIG[param](**{param: name})
    assert str(made.value) == f"{param}={name!r} is invalid: {message}"


@pytest.mark.parametrize("name", [n for n, reads in GRAMMAR.items() if not any(r.startswith("!") for r in reads)])
def test_a_name_both_take_makes_both_configs(name):
    assert SpeculativeConfig(draft=name).draft == DSparkConfig(drafter=name).drafter == name


def test_the_trace_names_the_sources_by_their_words():
    assert read_draft("lookup+model:x").trace_names == read_draft("lookup+x").trace_names == ("lookup", "model")
    assert read_draft("recycling+suffix").trace_names == ("recycling", "suffix")
    assert SpeculativeConfig(draft="lookup+model:x").draft_model == "model:x"
    assert SpeculativeConfig(draft="lookup+/m/a+b").draft_model == "/m/a+b"
    assert SpeculativeConfig(draft="lookup+recycling").draft_model is None


# ------------------------------------------------------------------------------ one point of resolution
@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=5)


MISSING = "feature:{tmp}/missing-f.safetensors"


@pytest.mark.parametrize("param", ["draft", "drafter"])
def test_a_bad_drafter_fails_at_the_decode_call_in_both_strategies(lm, tmp_path, param):
    """Both strategies resolve (and load) their drafter when decode() is called, so a drafter that cannot load
    fails there, before the first event: run() raises it as bad input, a lockstep lane records it with no steps.
    (DSpark resolved at its first event: its decode() call returned a generator and the error came later.)"""
    name = MISSING.format(tmp=tmp_path)
    config = CONFIG[param](max_new_tokens=2, **{param: name})
    with pytest.raises(ConfigError) as called:
        STRATEGIES[config.strategy].decode(lm, [1, 2, 3], config, generator=torch.Generator())   # no next()
    line = str(called.value)
    assert re.fullmatch(rf"{param}='{re.escape(name)}' is invalid: has no feature-drafter weights file: .+", line)
    with pytest.raises(ConfigError) as ran:
        run(lm, [1, 2, 3], config)
    lanes = run_lockstep(lm, [1, 2, 3], {"lane": (config, {})}, warm=False)
    assert str(ran.value) == lanes["lane"].error == line and lanes["lane"].steps == ()


def test_the_two_strategies_say_the_same_about_the_same_file(lm, tmp_path):
    name = MISSING.format(tmp=tmp_path)
    lines = []
    for param in ("draft", "drafter"):
        with pytest.raises(ConfigError) as err:
            run(lm, [1, 2, 3], CONFIG[param](max_new_tokens=2, **{param: name}))
        lines.append(str(err.value).split("=", 1)[1])
    assert lines[0] == lines[1]


def test_the_older_keyword_draft_lm_is_gone(lm):
    with pytest.raises(TypeError, match="draft_lm"):
        run(lm, [1, 2, 3], SpeculativeConfig(draft="lookup", max_new_tokens=2), draft_lm=lm)
