"""AppTest of the sidebar's Advanced options: DSpark's lossy threshold and cost table (an uploaded file,
auto, a table from a link) and the model's GGUF file and accelerate placement (device_map, max_memory,
offload_folder). Each reaches the run's config and trace, and the link reproduces the run. Bad values
are rows of the bad-input matrix (tests/test_bad_input.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_support import new_app, ok, run_state
from dspark_helpers import APP_CHAIN, app_drafter, one_thread
from weights_support import half_the_weights, save_tiny

from decoding.core.config import GreedyConfig
from decoding.core.trace import to_json
from decoding.runner import run as run_engine
from decoding.runtime.cost_table import CostTable
from decoding.runtime.models import ModelSpec, load

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
COST = "w.param.dspark.cost_table"
LOSSY = "w.param.dspark.lossy_threshold"


@pytest.fixture(scope="module")
def drafter_file(tiny_dir):
    return app_drafter(tiny_dir)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Uploaded and profiled cost tables, and default offloads, go to a fresh cache."""
    root = tmp_path / "cache"
    monkeypatch.setenv("DECODESCOPE_CACHE", str(root))
    return root


def table_json(ms) -> bytes:
    return json.dumps({"version": 1, "verify_ms": list(ms)}).encode()


def upload_cost(at, name: str, data: bytes):
    at.radio(key=COST).set_value("file").run()
    at.file_uploader(key=COST + ".file").set_value((name, data, "application/json")).run()
    return at


def link_of(at) -> dict:
    return {name: at.query_params[name] for name in at.query_params}


def offload_folders(model) -> set[str]:
    """Where the disk-offloaded modules of a placed model read their weights from (accelerate's
    loader keeps its folder even when it reads safetensors in place and writes nothing there)."""
    found = set()
    for module in model.modules():
        data = getattr(getattr(getattr(module, "_hf_hook", None), "weights_map", None), "dataset", None)
        if getattr(data, "save_folder", None) is not None:
            found.add(str(data.save_folder))
    return found


def steps(at, n: int):
    for _ in range(n):
        at.button(key="pg.step").click().run()
    ok(at)
    return run_state(at)


@pytest.mark.slow
def test_lossy_threshold_and_uploaded_cost_table_reach_the_trace_and_the_link(tiny_dir, drafter_file, cache):
    ms = [3.0 + 2.5 * n for n in range(9)]
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "temperature": "1",
                  "seed": "4"})
    at.text_input(key=LOSSY).set_value("0.5").run()
    upload_cost(at, "bench table.json", table_json(ms))
    ok(at)
    assert not at.error
    config = at.session_state["ds.settings"].config
    assert config.lossy_threshold == 0.5 and config.cost_table.startswith(str(cache))
    assert CostTable.load(config.cost_table).verify_ms == tuple(ms)
    assert any(c.value.startswith("bench table.json: 9 entries") for c in at.sidebar.caption)
    live = steps(at, 2)
    trace = live.trace()
    assert trace.config["lossy_threshold"] == 0.5
    assert trace.config["cost_table"] == Path(config.cost_table).name     # no server folder in the trace
    assert str(cache) not in to_json(trace)
    event = trace.steps[1]
    assert event.lossy and event.size is not None
    assert event.size.cost_source == Path(config.cost_table).name and list(event.size.verify_ms) == ms

    link = link_of(at)
    assert link["lossy_threshold"] == "0.5" and [float(v) for v in link["cost_table"].split(",")] == ms
    again = new_app(link)                                       # the link alone, in a fresh session
    ok(again)
    assert again.radio(key=COST).value == "file" and again.text_input(key=LOSSY).value == "0.5"
    replayed = again.session_state["ds.settings"].config
    assert replayed.lossy_threshold == 0.5 and CostTable.load(replayed.cost_table).verify_ms == tuple(ms)
    relive = run_state(again)                                   # the link opens on its step: replayed to it
    assert again.query_params["step"] == "1" and len(relive.events) == 2
    assert relive.output_ids == live.output_ids
    assert [e.size.size for e in relive.events[1:]] == [e.size.size for e in live.events[1:]]


@pytest.mark.slow
def test_cost_table_auto_profiles_on_first_use(tiny_dir, drafter_file, cache):
    at = new_app({**APP_CHAIN, "strategy": "dspark", "drafter": drafter_file, "gamma": "3", "cost_table": "auto"})
    ok(at)
    assert at.radio(key=COST).value == "auto" and at.session_state["ds.settings"].config.cost_table == "auto"
    event = steps(at, 2).events[1]
    assert event.size.cost_source.startswith("auto: ")                   # the trace: no server folder
    source = cache / "cost" / event.size.cost_source.removeprefix("auto: ")
    assert source.is_file()                                              # profiled here, then cached
    assert CostTable.load(source).verify_ms == event.size.verify_ms
    assert link_of(at)["cost_table"] == "auto"
    at.radio(key=COST).set_value("none").run()                           # negative control: off again
    assert at.session_state["ds.settings"].config.cost_table is None and link_of(at)["cost_table"] == "none"
    assert steps(at, 2).events[1].size is None
    link = {k: v for k, v in {**APP_CHAIN, "drafter": drafter_file}.items() if k != "cost_table"}
    default = new_app({**link, "strategy": "dspark", "gamma": "3"})      # a link without one: DSpark's default
    ok(default)
    assert default.radio(key=COST).value == "auto" and default.session_state["ds.settings"].config.cost_table == "auto"


@pytest.mark.slow
def test_device_map_max_memory_and_offload_folder_place_the_model(tiny_dir, tmp_path, cache):
    model_dir = save_tiny(tmp_path / "placed")
    budget = half_the_weights(model_dir)
    offload = tmp_path / "offload"
    at = new_app({"model": model_dir, "device_map": "auto", "max_memory": budget, "chat": "0",
                  "prompt": "w1 w2 w3 w1 w2"})
    at.text_input(key="w.offload_folder").set_value(str(offload)).run()
    ok(at)
    assert not at.error
    assert at.session_state["ds.settings"].model_options == {"device_map": "auto", "max_memory": budget,
                                                             "offload_folder": str(offload)}
    live = steps(at, 3)
    assert set(live.trace().model["device_map"]) == {"cpu", "disk"}          # the budget split it
    assert offload_folders(live.lm.model) == {str(offload)}                 # offloaded where asked
    plain = load(ModelSpec(name=model_dir, device="cpu"))
    assert list(live.output_ids) == list(run_engine(plain, live.prompt_ids, GreedyConfig(max_new_tokens=3)).output_ids)

    link = link_of(at)
    assert (link["device_map"], link["max_memory"]) == ("auto", budget) and "offload_folder" not in link
    again = new_app(link)
    ok(again)
    assert again.selectbox(key="w.device_map").value == "auto" and again.text_input(key="w.max_memory").value == budget
    assert again.session_state["ds.settings"].model_options == {"device_map": "auto", "max_memory": budget}


def test_gguf_file_reaches_the_loader(tiny_dir, tmp_path, monkeypatch):
    """A stand-in for the GGUF loader (a real GGUF is the 94 MiB embedded model) records the file it
    is asked for and loads the tiny model."""
    import decoding.runtime.models as models

    asked = []

    def fake_gguf(gguf, dtype, placed=None):
        asked.append(gguf)
        return models._load_dir(str(tiny_dir), dtype, trust_remote_code=False, local_only=True, placed=placed)

    monkeypatch.setattr(models, "_load_gguf", fake_gguf)
    folder = tmp_path / "ggufs"
    folder.mkdir()
    (folder / "small.gguf").write_bytes(b"GGUF")
    at = new_app({"model": str(folder), "gguf_file": "small.gguf"})
    ok(at)
    assert not at.error and asked == [folder / "small.gguf"]
    assert at.text_input(key="w.gguf_file").value == "small.gguf" and link_of(at)["gguf_file"] == "small.gguf"
    assert steps(at, 1).trace().model["name"] == str(folder)


def test_fast_path_on_the_cpu_is_one_line_and_stays_in_the_link(tiny_dir):
    at = new_app({"model": str(tiny_dir), "fast_path": "1", "chat": "0", "prompt": "w1 w2 w3"})
    assert at.checkbox(key="w.fast_path").value is True
    assert at.session_state["ds.settings"].model_options == {"fast_path": True}
    assert [e.value for e in at.error] == ["fast_path=True is invalid: needs a CUDA device (the model is on cpu)"]
    assert link_of(at)["fast_path"] == "1"


@pytest.mark.slow
def test_fast_path_reaches_the_loader_and_the_trace(tiny_dir, monkeypatch):
    """With CUDA graphs emulated (the CPU has none), the sidebar's fast path loads the model on it: the run's
    trace describes it and its tokens are plain greedy's."""
    from decoding.runtime import fast_path

    monkeypatch.setattr(fast_path, "CudaGraph", fast_path.EmulatedGraph)
    monkeypatch.setattr(fast_path, "fast_path_error", lambda device: None)
    at = new_app({"model": str(tiny_dir), "chat": "0", "prompt": "w1 w2 w3 w1 w2"})
    at.checkbox(key="w.fast_path").check().run()
    ok(at)
    assert not at.error
    live = steps(at, 3)
    assert live.lm.fast is not None and "graphs" in live.trace().model["fast_path"]
    plain = load(ModelSpec(name=str(tiny_dir), device="cpu"))
    assert list(live.output_ids) == list(run_engine(plain, live.prompt_ids, GreedyConfig(max_new_tokens=3)).output_ids)
