"""A model load reports its stages (decoding/runtime/load_progress.py) and the page shows them while it
waits (ui.widgets.session.load_showing_progress); a GGUF file is parsed once per conversion
(decoding/runtime/gguf_once.py)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as loader

from decoding.core.errors import ConfigError
from decoding.runtime import gguf_once, load_progress, models
from ui.widgets import session


def stage_key() -> str | None:
    now = load_progress.current()
    return None if now is None else now.stage.key


def test_stages_are_recorded_within_a_load_only_and_cleared_however_it_ends():
    load_progress.report("tune")                          # a plan profiled outside a load: not a load's stage
    assert load_progress.current() is None
    with pytest.raises(ConfigError):
        with load_progress.loading():
            load_progress.report("read")
            assert stage_key() == "read" and load_progress.current().stage.text.startswith("Reading the GGUF")
            raise ConfigError("model", "x", "failed")
    assert load_progress.current() is None
    first_start = [s.at for k, s in load_progress.STAGES.items() if k != "load"]
    assert first_start == sorted(first_start) and all(0 <= at < 1 for at in first_start)


def test_a_conversion_reports_reading_then_dequantizing_then_saving(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF stand-in")
    seen = []
    model = SimpleNamespace(config=SimpleNamespace(), to=lambda dtype: model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: seen.append(stage_key()) or "tok")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: seen.append(stage_key()) or model)
    monkeypatch.setattr(models, "save_to_cache", lambda save, path: seen.append(stage_key()))
    with load_progress.loading():
        assert models._load_gguf(gguf_file, None) == (model, "tok")
    assert seen == ["read", "dequantize", "save"]


def tiny_gguf(path) -> str:
    """A GGUF file with a llama's metadata and one small tensor (no tokenizer: metadata reads only)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    return str(path)


def test_a_gguf_file_is_read_once_within_parsed_once_and_as_before_after(tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    built = []

    class Counted(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    original = loader.load_gguf_checkpoint
    with gguf_once.parsed_once():
        first = loader.load_gguf_checkpoint(path, return_tensors=False)
        first["config"]["changed_by_a_caller"] = True
        second = loader.load_gguf_checkpoint(path, return_tensors=False)
        assert gguf.GGUFReader(path) is gguf.GGUFReader(path)
    assert len(built) == 1
    assert "changed_by_a_caller" not in second["config"] and second["config"]["num_hidden_layers"] == 1
    assert loader.load_gguf_checkpoint is original and gguf.GGUFReader is Counted
    loader.load_gguf_checkpoint(path, return_tensors=False)
    assert len(built) == 2                                  # outside: transformers reads it as it does


KEY = ("not-held-model", "cpu", "float32")     # a Settings.model_key() no test loads


def test_a_slow_load_shows_its_stage_until_it_ends(monkeypatch):
    release = threading.Event()
    shown = []

    def slow_load(key):
        with load_progress.loading():
            load_progress.report("dequantize")
            release.wait(5)
            return ("lm", key)

    def show(where, now):
        shown.append(None if now is None else now.stage.key)
        release.set()

    monkeypatch.setattr(session, "load_lm_for", slow_load)
    monkeypatch.setattr(session, "show_stage", show)
    monkeypatch.setattr(session, "PROGRESS_AFTER_S", 0.01)
    monkeypatch.setattr(session, "PROGRESS_POLL_S", 0.01)
    assert session.load_showing_progress(KEY) == ("lm", KEY)
    assert "dequantize" in shown


def test_a_quick_load_shows_nothing_and_a_failed_one_raises_its_error(monkeypatch):
    monkeypatch.setattr(session, "show_stage", lambda where, now: pytest.fail("no bar for a quick load"))
    monkeypatch.setattr(session, "load_lm_for", lambda key: "lm")
    assert session.load_showing_progress(KEY) == "lm"

    def failing(key):
        time.sleep(0.01)
        raise ConfigError("model", "m", "no such model")

    monkeypatch.setattr(session, "load_lm_for", failing)
    with pytest.raises(ConfigError, match="no such model"):
        session.load_showing_progress(KEY)


def test_the_bar_names_the_stage_and_its_seconds():
    calls = []
    where = SimpleNamespace(progress=lambda value, text: calls.append((value, text)))
    session.show_stage(where, load_progress.Current(load_progress.STAGES["tune"], time.monotonic() - 3.2))
    session.show_stage(where, None)
    assert calls == [(0.65, "Timing the matrix kernels on this CPU (first start only)… 3 s"),
                     (0.0, "Loading the model…")]


def test_a_held_model_is_returned_without_the_loader(monkeypatch):
    """A rerun with its model in memory gets it at once: no loader thread, no progress bar."""
    monkeypatch.setattr(session, "load_lm_for", lambda key: pytest.fail("a held model is not loaded again"))
    monkeypatch.setattr(session, "show_stage", lambda where, now: pytest.fail("no bar for a held model"))
    held = object()
    monkeypatch.setattr(session, "TARGETS", session.ModelCache(2))
    session.TARGETS.get(session.target_key("held", "cpu", "float32", {}), lambda: held)
    assert session.load_showing_progress(("held", "cpu", "float32")) is held
