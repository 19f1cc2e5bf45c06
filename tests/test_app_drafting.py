"""AppTest: the sidebar says, under the draft (drafter) field, which sources a speculative (DSpark) run will
use on the loaded model and why, in the step panel's words; the first speculative round's panel says it
too. On the tiny model no shipped drafter fits, so `auto` is training-free."""
from __future__ import annotations

import pytest
from app_support import new_app, no_model, ok, run_state, tour_app  # noqa: F401  (no_model: fixture)

from decoding.drafters.factory import AUTO_FITS, AUTO_FREE
from ui.views.sources import memory_text
from ui.widgets.sidebar import NOT_LOADED

FREE = f"Lattice sources: prompt lookup, token recycling. {AUTO_FREE}" + memory_text("empty")
FREE_SPEC = FREE.replace("Lattice sources", "Draft sources")        # a speculative run drafts a chain


def free(strategy: str) -> str:
    return FREE_SPEC if strategy == "speculative" else FREE


REPEAT = "one two three one two three one two"


def captions(at) -> list[str]:
    return [c.value for c in at.sidebar.caption]


@pytest.mark.parametrize("strategy", ["speculative", "dspark"])
@pytest.mark.slow
def test_the_sidebar_says_what_auto_resolves_to_on_the_model(tiny_dir, strategy):
    at = new_app({"strategy": strategy})
    ok(at)
    assert free(strategy) in captions(at)


@pytest.mark.parametrize("strategy,field,line", [
    ("speculative", "draft", "Draft sources: token recycling. draft 'recycling' as set" + memory_text("empty")),
    ("dspark", "drafter", "Lattice sources: prompt lookup, suffix matching. drafter 'suffix' as set"
     + memory_text("empty"))])
def test_the_caption_follows_the_typed_value(tiny_dir, strategy, field, line):
    at = new_app({"strategy": strategy})
    at.sidebar.text_input(key=f"w.param.{strategy}.{field}").set_value(line.split("'")[1]).run()
    ok(at)
    assert line in captions(at) and free(strategy) not in captions(at)


def test_the_first_speculative_round_names_its_sources(tiny_dir):
    at = new_app({"strategy": "speculative", "max_new": "4", "prompt": REPEAT, "chat": "0"})
    at.button(key="pg.step").click().run()
    ok(at)
    assert run_state(at).events[0].drafting.reason == AUTO_FREE
    assert FREE_SPEC in [t.value for t in at.text]


def test_a_page_without_a_model_loads_none_for_the_caption(no_model):
    at = tour_app({"strategy": "speculative"})
    ok(at)
    assert no_model == [] and (NOT_LOADED in captions(at) or FREE_SPEC in captions(at))


@pytest.mark.real
@pytest.mark.parametrize("strategy", ["speculative", "dspark"])
def test_on_the_embedded_model_auto_is_the_shipped_feature_drafter(tiny_dir, strategy):
    at = new_app({"model": "default", "strategy": strategy})
    ok(at)
    names = "prompt lookup, feature head" if strategy == "speculative" else "feature head, prompt lookup"
    label = "Draft sources" if strategy == "speculative" else "Lattice sources"
    assert f"{label}: {names}. {AUTO_FITS}" in captions(at)
