"""The sidebar's Advanced options without streamlit: which config fields are optional, their text and
URL forms, DSpark's cost table from an upload or a link, and the model's placement options."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from decoding.core.config import DSparkConfig
from decoding.core.errors import ConfigError
from decoding.runtime.cost_table import CostTable
from ui.widgets import advanced
from ui.widgets.advanced import CostPick, cost_from_json, cost_from_link, cost_to_link, optional_fields, pick_cost
from ui.widgets.params import Settings, build_config, from_query, param_fields, to_query


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))


def table_json(ms, version=1) -> bytes:
    return json.dumps({"version": version, "verify_ms": list(ms)}).encode()


def test_the_optional_fields_are_the_cost_tables_and_lossy_threshold():
    assert [(f.name, f.type) for f in optional_fields("dspark")] == [("cost_table", str), ("lossy_threshold", float)]
    assert [(f.name, f.type) for f in optional_fields("speculative")] == [("cost_table", str)]   # gamma_policy cost
    assert all(optional_fields(s) == [] for s in ("greedy", "sample", "beam"))
    simple = {f.name for f in param_fields("dspark")} | {f.name for f in param_fields("speculative")}
    assert not simple & {"cost_table", "lossy_threshold"}            # not plain widgets: they were unreachable


def test_optional_text_is_none_when_empty_and_kept_when_it_does_not_parse():
    assert advanced.optional_value("", float) is None and advanced.optional_value("  ", float) is None
    assert advanced.optional_value("0.25", float) == 0.25
    assert advanced.optional_value("abc", float) == "abc"
    with pytest.raises(ConfigError) as err:                         # the config names the text
        DSparkConfig(temperature=1.0, lossy_threshold=advanced.optional_value("abc", float))
    assert str(err.value).startswith("lossy_threshold='abc' is invalid")


def test_cost_table_upload_link_round_trip_is_exact():
    ms = (4.1, 5.000000000000001, 7.25, 9.5, 12.0)
    table = cost_from_json(table_json(ms), "mine.json")
    assert table.verify_ms == ms and table.source == "mine.json"
    assert cost_from_link(cost_to_link(table)).verify_ms == ms
    assert ";" not in cost_to_link(table) and cost_from_link(cost_to_link(table)).overhead_ms == 0.0


def test_cost_table_overhead_travels_in_uploads_and_links():
    data = json.dumps({"version": 1, "verify_ms": [4.0, 6.5], "overhead_ms": 3.25}).encode()
    table = cost_from_json(data, "mine.json")
    assert table.overhead_ms == 3.25
    link = cost_to_link(table)
    assert link == "4.0,6.5;3.25"
    assert cost_from_link(link) == dataclasses.replace(table, source="link")


@pytest.mark.parametrize("data, expected", [
    (b"{nope", "could not be read (Expecting property name"),
    (table_json([1.0, 2.0], version=2), "must be a JSON object with version 1"),
    (table_json([1.0, -2.0]), "entries must be positive milliseconds"),
    (b"[" * 100_000, "could not be read"),
])
def test_bad_uploads_name_the_cost_table(data, expected):
    with pytest.raises(ConfigError) as err:
        cost_from_json(data, "bad.json")
    assert err.value.param == "cost_table" and expected in str(err.value)


def test_oversized_upload_is_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(advanced, "MAX_COST_BYTES", 10)
    with pytest.raises(ConfigError, match=r"cost_table='big.json' is invalid: is over 10 bytes"):
        cost_from_json(table_json([1.0, 2.0]), "big.json")


@pytest.mark.parametrize("text", ["fast", "1,,2", "1,x", "-1,2", "0", "1,2;", "1,2;-1", "1,2;nan", "1,2;x", "1;2;3"])
def test_bad_link_values_name_the_cost_table(text):
    with pytest.raises(ConfigError) as err:
        cost_from_link(text)
    assert str(err.value).startswith(f"cost_table={text!r} is invalid")


def test_pick_cost_stores_the_table_and_its_config_value_points_at_it():
    pick = pick_cost("file", ("my table.json", table_json([2.0, 3.0, 4.0, 5.0])), None)
    assert pick.error is None and Path(pick.path).name == "my_table.json"
    assert CostTable.load(pick.path).verify_ms == (2.0, 3.0, 4.0, 5.0)
    assert pick.config_value() == pick.path and pick.link() == "2.0,3.0,4.0,5.0"
    from_link = pick_cost("file", None, "2.0,3.0,4.0,5.0")                 # no upload: the link's table
    assert from_link.table.verify_ms == pick.table.verify_ms and from_link.name == "link"
    assert pick_cost("auto", None, None).config_value() == "auto" and pick_cost("auto", None, None).link() == "auto"
    assert pick_cost("none", None, "1,2").config_value() is None and pick_cost("none", None, None).link() == "none"


def test_the_cost_widget_starts_where_the_config_does():
    """DSpark's config defaults to an auto table, speculative's to none (its cost policy is opt-in); a
    link's 'none' is kept (DSpark would otherwise read the absent table as its auto default)."""
    from decoding.core.config import DSparkConfig, SpeculativeConfig

    assert DSparkConfig().cost_table == "auto" and advanced.default_cost_mode("dspark") == "auto"
    assert SpeculativeConfig().cost_table is None and advanced.default_cost_mode("speculative") == "none"
    assert DSparkConfig(cost_table="none").cost_table is None
    assert advanced.link_mode(pick_cost("none", None, None).link()) == "none"


def test_a_file_pick_without_a_file_or_with_a_bad_one_is_an_error():
    empty = pick_cost("file", None, None)
    with pytest.raises(ConfigError, match=r"cost_table=None is invalid: upload a JSON cost table"):
        empty.config_value()
    bad = pick_cost("file", ("x.json", b"{nope"), None)
    with pytest.raises(ConfigError, match=r"cost_table='x.json' is invalid: could not be read"):
        bad.config_value()


def test_build_config_checks_the_picked_table_covers_the_run():
    pick = pick_cost("file", ("short.json", table_json([1.0, 2.0, 3.0])), None)
    with pytest.raises(ConfigError,
                       match=r"cost_table='short.json' is invalid: covers 3 tokens; this run verifies up to 4"):
        build_config("dspark", {"gamma": 3, "select": "chain", "cost_table": pick}, seed=0, max_new_tokens=8, top_n=5)
    config = build_config("dspark", {"gamma": 2, "select": "chain", "cost_table": pick}, seed=0, max_new_tokens=8,
                          top_n=5)
    assert config.cost_table == pick.path                              # negative control: 3 tokens cover γ=2


def test_query_form_of_the_advanced_options():
    pick = pick_cost("file", ("t.json", table_json([1.5, 2.5, 3.5])), None)
    settings = Settings(strategy="dspark", params={"gamma": 2, "cost_table": pick, "lossy_threshold": 0.4},
                        model_options={"gguf_file": "m.gguf", "device_map": "auto", "max_memory": "cpu=1GiB",
                                       "offload_folder": "/tmp/off"})
    query = to_query(settings)
    assert query["cost_table"] == "1.5,2.5,3.5" and query["lossy_threshold"] == "0.4"
    assert (query["gguf_file"], query["device_map"], query["max_memory"]) == ("m.gguf", "auto", "cpu=1GiB")
    assert "offload_folder" not in query                               # a link never chooses where the server writes
    shared, params, bad = from_query(query)
    assert bad == [] and params["cost_table"] == "1.5,2.5,3.5" and params["lossy_threshold"] == "0.4"
    assert (shared["gguf_file"], shared["device_map"], shared["max_memory"]) == ("m.gguf", "auto", "cpu=1GiB")
    off = to_query(Settings(strategy="dspark", params={"gamma": 2, "cost_table": CostPick(), "lossy_threshold": None}))
    assert off["cost_table"] == "none" and "lossy_threshold" not in off and "device_map" not in off


def test_model_options_and_settings_key():
    assert advanced.model_options(gguf_file=" ", device_map="none", max_memory="", offload_folder=None) == {}
    options = advanced.model_options(gguf_file="a.gguf", device_map="auto", max_memory=" cpu=1GiB ")
    assert options == {"gguf_file": "a.gguf", "device_map": "auto", "max_memory": "cpu=1GiB"}
    plain = Settings(model="m")
    assert plain.model_key() == ("m", "auto", "auto")                  # the same cache entry as before
    placed = Settings(model="m", model_options=options)
    assert placed.model_key()[:3] == ("m", "auto", "auto") and dict(placed.model_key()[3:]) == options
    assert advanced.device_map_link_error("auto") is None and advanced.device_map_link_error("none") is None
    assert advanced.device_map_link_error("everywhere").startswith(
        "device_map='everywhere' is invalid: choose one of auto")
