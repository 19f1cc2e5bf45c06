"""Cost tables cost what their input can pay for: a file over MAX_COST_BYTES is refused after reading
that much (not read whole), JSON nested too deeply is one line naming the parameter, a table has at most
MAX_COST_ENTRIES entries, a link's table is refused by length before it is split, and the tables that
uploads and links store in the cache are bounded (the least recently used go first)."""
from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from decoding.core.errors import ConfigError
from decoding.runtime.cost_table import MAX_COST_BYTES, MAX_COST_ENTRIES, CostTable
from ui.widgets import advanced
from ui.widgets.advanced import MAX_STORED_COSTS, cost_from_json, cost_from_link, store_cost


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))


def test_a_huge_cost_file_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as file:
        file.truncate(64 * MAX_COST_BYTES)                   # sparse: 64 MiB of zeros on no disk
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=rf"^cost_table='.*huge.json' is invalid: is over {MAX_COST_BYTES} bytes"):
            CostTable.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_COST_BYTES


@pytest.mark.parametrize("read", ["file", "upload"])
def test_deeply_nested_json_names_the_cost_table(tmp_path, read):
    text = "[" * 10_000 + "]" * 10_000
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        CostTable.load(path) if read == "file" else cost_from_json(text.encode(), "deep.json")
    assert err.value.param == "cost_table" and "nested too deeply" in str(err.value)


def test_a_table_has_at_most_max_entries(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"version": 1, "verify_ms": [1.0] * (MAX_COST_ENTRIES + 1)}))
    with pytest.raises(ConfigError, match=rf"cost_table='.*long.json' is invalid: needs 1 to {MAX_COST_ENTRIES}"):
        CostTable.load(path)
    assert CostTable(verify_ms=(1.0,) * MAX_COST_ENTRIES).max_tokens == MAX_COST_ENTRIES


def test_a_link_with_thousands_of_values_is_refused():
    with pytest.raises(ConfigError, match=r"^cost_table='1.0,1.0,.*…' is invalid: needs 1 to"):
        cost_from_link(",".join(["1.0"] * 7000))
    long = "1" * (advanced.MAX_COST_LINK_CHARS + 1)
    with pytest.raises(ConfigError, match=r"characters long, over the \d+ a link's table may have"):
        cost_from_link(long)


def stored_folders() -> list[Path]:
    root = Path(os.environ["DECODESCOPE_CACHE"]) / "cost" / "uploads"
    return [d for d in root.iterdir() if d.is_dir()]


def store_at(table: CostTable, name: str, when: float) -> Path:
    path = Path(store_cost(table, name))
    os.utime(path.parent, (when, when))                        # explicit times: no clock resolution ties
    return path


def test_stored_tables_are_bounded_and_the_recent_ones_kept():
    base = 1e9
    first = store_at(CostTable(verify_ms=(1.0, 2.0)), "first.json", base)
    older = [store_at(CostTable(verify_ms=(float(i + 10),)), f"t{i}.json", base + 1 + i)
             for i in range(MAX_STORED_COSTS - 1)]
    assert len(stored_folders()) == MAX_STORED_COSTS
    assert Path(store_cost(CostTable(verify_ms=(1.0, 2.0)), "first.json")) == first   # used again: newest
    newer = [store_at(CostTable(verify_ms=(float(i + 100),)), f"n{i}.json", base + 100 + i) for i in range(8)]
    assert len(stored_folders()) == MAX_STORED_COSTS
    assert first.is_file() and all(p.is_file() for p in newer + older[8:])
    assert not any(p.exists() for p in older[:8])


@pytest.fixture
def unwritable_cache(tmp_path, monkeypatch):
    """The cache a regular file (no folder can be made under it), the temporary folder a fresh one; the
    cache warning not yet shown in this process."""
    import tempfile
    import threading

    from decoding.runtime import files

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be\n")
    monkeypatch.setenv("DECODESCOPE_CACHE", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(files, "_cache_warned", threading.Event())
    return tmp_path / "tmp"


def test_an_upload_with_an_unwritable_cache_is_kept_in_the_temporary_folder(unwritable_cache):
    with pytest.warns(UserWarning, match="cannot be written"):
        pick = advanced.pick_cost("file", ("mine.json", b'{"version": 1, "verify_ms": [1.5, 2.5]}'), None)
    assert pick.error is None and Path(pick.config_value()).is_relative_to(unwritable_cache)
    assert CostTable.load(pick.config_value()).verify_ms == (1.5, 2.5)
    assert store_cost(pick.table, "mine.json") == pick.config_value()          # found there again


def test_an_upload_with_nowhere_to_store_it_is_one_line(unwritable_cache):
    unwritable_cache.rmdir()
    unwritable_cache.write_text("not a folder either\n")
    with pytest.warns(UserWarning):
        pick = advanced.pick_cost("file", ("mine.json", b'{"version": 1, "verify_ms": [1.5]}'), None)
    assert pick.error == ("cost_table='mine.json' is invalid: could not be stored: neither the cache folder nor "
                          "the temporary folder can be written (set DECODESCOPE_CACHE to a writable folder)")
    with pytest.raises(ConfigError, match="could not be stored"):
        pick.config_value()
