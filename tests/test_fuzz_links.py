"""Property-based tests of link (URL query) parameters: whatever a link carries, parsing it and building
the config either works or refuses with one ConfigError line naming a parameter (never another exception),
and the app opened with it renders the Playground and takes a step with no exception and one-line errors
only, none of them a link, an image or HTML made of a link value. Seeded (derandomize) and bounded, so
`make test` runs the same examples every time."""
from __future__ import annotations

import dataclasses
import re

import pytest
from app_support import new_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from md_helpers import links, page_markdown

from decoding.core.errors import ConfigError
from decoding.runner import STRATEGIES
from ui.widgets.advanced import COST_FIELD, optional_fields, optional_value, pick_cost
from ui.widgets.params import QP_SCALARS, build_config, from_query, param_fields

pytestmark = pytest.mark.slow   # fuzz tests: `make test-fast` leaves them out

PARAM_NAMES = sorted({f.name for s in STRATEGIES for f in param_fields(s)}
                     | {f.name for s in STRATEGIES for f in optional_fields(s)})
NAMES = sorted(set(QP_SCALARS) - {"strategy"}) + PARAM_NAMES + ["zzz"]
NASTY = ["", " ", "nan", "inf", "-inf", "1e999", "-1", "0", "1", "0.5", "99999999999999999999999999", "1e-320",
         "true", "auto", "none", "lookup+", "shallow:/nonexistent", "feature:", "cpu=1e999GiB", "0=-5GB", "\x00",
         "1,2,3", "1," * 50, "é" * 300, "default", "../../etc/passwd", "chain", "tree", "cost",
         "[x](http://evil)", "![i](http://evil/i.png)", "<img src=x>"]
VALUES = st.one_of(st.sampled_from(NASTY), st.text(max_size=30), st.integers().map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))
QUERIES = st.builds(lambda strategy, rest: {"strategy": strategy, **rest}, st.sampled_from(sorted(STRATEGIES)),
                    st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=8))
CONFIG_FIELDS = {"seed": "seed", "max_new": "max_new_tokens", "top_n": "top_n"}


def config_from_link(query: dict):
    """What the sidebar builds from a link's values (widgets hold the parsed values; optional fields
    their text; the cost table a pick), or the ConfigError it shows."""
    shared, params, _bad = from_query(query)
    strategy = shared.get("strategy", "greedy")
    if strategy not in STRATEGIES:
        return None
    optional = {f.name: f.type for f in optional_fields(strategy)}
    values = {}
    for name, value in params.items():
        if name == COST_FIELD:
            values[name] = pick_cost("file" if value not in ("none", "auto") else value, None, value)
        else:
            values[name] = optional_value(value, optional[name]) if name in optional else value
    shared_values = {CONFIG_FIELDS[k]: shared[k] for k in CONFIG_FIELDS if k in shared}
    return build_config(strategy, values, **{"seed": 0, "max_new_tokens": 8, "top_n": 5, **shared_values})


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(QUERIES)
def test_any_link_builds_a_config_or_one_named_refusal(query):
    try:
        config = config_from_link(query)
    except ConfigError as err:
        line = str(err)
        assert "\n" not in line and re.match(r"^[a-z_]+=", line), line
        return
    if config is not None:
        assert dataclasses.is_dataclass(config)


def test_the_property_sees_a_refusal():
    """Negative control: a link with a bad value does reach the refusal branch above."""
    with pytest.raises(ConfigError, match=r"^top_k=-1 is invalid"):
        config_from_link({"strategy": "sample", "top_k": "-1"})


APP_QUERIES = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(NASTY), min_size=1, max_size=4)


@settings(max_examples=10, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(STRATEGIES)), APP_QUERIES)
def test_any_link_renders_and_steps_cleanly(tiny_dir, strategy, query):  # noqa: F811
    query = {k: v for k, v in query.items() if k != "model"}      # the tiny model stays (no model load per case)
    at = new_app({"strategy": strategy, **query, "max_new": "4"})
    assert not at.exception, [e.value for e in at.exception]
    step = [b for b in at.button if b.key == "pg.step"]
    if step and not step[0].disabled:
        step[0].click().run()
        assert not at.exception, [e.value for e in at.exception]
    for element in list(at.error) + list(at.warning):
        assert len(str(element.value).strip().splitlines()) == 1, element.value
        assert "Traceback" not in str(element.value)
    assert [text for text in page_markdown(at) if links(text)] == []      # link values show as text


def test_an_overlong_link_value_is_ignored_by_name():
    """A link value longer than MAX_LINK_CHARS is not parsed (a prompt of a million characters would
    otherwise be tokenized at every rerun); the rest of the link still applies."""
    from ui.widgets.params import MAX_LINK_CHARS

    shared, _params, bad = from_query({"prompt": "x" * (MAX_LINK_CHARS + 1), "seed": "3"})
    assert bad == ["prompt"] and shared == {"seed": 3}
    shared, _params, bad = from_query({"prompt": "x" * MAX_LINK_CHARS})
    assert bad == [] and len(shared["prompt"]) == MAX_LINK_CHARS
