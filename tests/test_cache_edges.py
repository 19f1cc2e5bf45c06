"""The per-user cache (DECODESCOPE_CACHE) at its edges: an empty variable means the default folder; a cache
that cannot be written leaves everything working, with one warning; damaged cache files (a converted
model, an auto cost table, distillation data) are made again instead of failing, and never blamed on a
parameter the user did not give; errors name server-side files by their name alone. Every cache folder and
asset path is built in decoding/runtime/paths.py alone (read from the source; negative control: a planted
`cache_root() / "distill"` and an `"assets"` folder name are caught)."""
from __future__ import annotations

import ast
import json
import os
import threading
import warnings
from pathlib import Path

import pytest
import torch
from dspark_helpers import one_thread, varied_llama
from word_models import build_word_model_dir

from decoding.core.errors import ConfigError
from decoding.runtime import cost_table as cost_module
from decoding.runtime import files, models
from decoding.runtime.paths import ASSETS, cache_dir, cache_root, shown_path
from decoding.train.data import generate_distill

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture
def fresh_warning(monkeypatch):
    """The cache warning not yet shown in this process."""
    monkeypatch.setattr(files, "_cache_warned", threading.Event())


@pytest.fixture(scope="module")
def small():
    return varied_llama(seed=3)


def unwritable_cache(tmp_path: Path, monkeypatch) -> Path:
    """DECODESCOPE_CACHE pointing at a regular file: no folder can be made under it (for root too)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be\n")
    monkeypatch.setenv("DECODESCOPE_CACHE", str(blocker))
    return blocker


# ------------------------------------------------------------------------------ the folder

@pytest.mark.parametrize("value", ["", "   "])
def test_empty_cache_variable_means_the_default_folder(value, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", value)
    assert cache_root() == Path.home() / ".cache" / "decodescope"


def test_cache_variable_expands_the_home_folder(monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", "~/elsewhere")
    assert cache_root() == Path.home() / "elsewhere"


def test_each_cache_folder_is_named_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    assert cache_dir("distill") == tmp_path / "distill"
    assert cache_dir("cost/uploads") == tmp_path / "cost" / "uploads"
    with pytest.raises(ValueError, match="'weights'"):
        cache_dir("weights")


ROOT = Path(__file__).resolve().parents[1]
PATHS = "decoding/runtime/paths.py"


def path_builders(sources: dict[str, str]) -> list[str]:
    """Where a module other than paths.py calls cache_root() or names the assets folder."""
    bad = []
    for rel, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)) if rel != PATHS else ():
            called = getattr(node, "func", None)
            name = getattr(called, "id", None) or getattr(called, "attr", None)
            if isinstance(node, ast.Call) and name == "cache_root":
                bad.append(f"{rel}:{node.lineno} calls cache_root()")
            elif isinstance(node, ast.Constant) and node.value == "assets":
                bad.append(f"{rel}:{node.lineno} names the assets folder")
    return bad


def product_sources() -> dict[str, str]:
    files = [ROOT / "app.py", *(p for d in ("decoding", "ui", "app_pages", "bench") for p in (ROOT / d).rglob("*.py"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in files}


def test_only_paths_builds_cache_and_asset_paths():
    sources = product_sources()
    assert PATHS in sources and len(sources) > 100
    assert path_builders(sources) == []


def test_a_path_built_elsewhere_is_caught():
    planted = {PATHS: "x = cache_root() / 'distill'\n",
               "decoding/train/x.py": "from decoding.runtime import paths\n\n\ny = paths.cache_root() / 'distill'\n",
               "bench/y.py": "from pathlib import Path\nZ = Path(__file__).parents[1] / 'assets' / 'tour'\n"}
    assert path_builders(planted) == ["bench/y.py:2 names the assets folder",
                                      "decoding/train/x.py:4 calls cache_root()"]


def test_unwritable_cache_works_without_it_and_warns_once(small, tmp_path, monkeypatch, fresh_warning):
    unwritable_cache(tmp_path, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = cost_module.load_table(small, "auto", 4)
        second = cost_module.load_table(small, "auto", 4)           # profiled again: nothing was kept
    assert first.max_tokens >= 4 and second.max_tokens >= 4
    shown = [w for w in caught if issubclass(w.category, files.CacheWarning)]
    assert len(shown) == 1, [str(w.message) for w in caught]
    assert "cannot be written" in str(shown[0].message) and "DECODESCOPE_CACHE" in str(shown[0].message)


def test_unwritable_cache_keeps_distillation_working(small, tmp_path, monkeypatch, fresh_warning):
    unwritable_cache(tmp_path, monkeypatch)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        data = generate_distill(small, [[1, 2, 3], [4, 5]], answer_tokens=4, batch_size=2, progress=False)
    assert data.positions == 8


# ------------------------------------------------------------------------------ damaged cache files

def test_garbage_auto_cost_table_is_profiled_again(small, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    path = cost_module.auto_cost_path(small)
    path.parent.mkdir(parents=True)
    path.write_text("{half a table")
    table = cost_module.load_table(small, "auto", 4)                # not: cost_table='...' is invalid
    assert table.max_tokens >= cost_module.AUTO_MIN_TOKENS
    assert cost_module.CostTable.load(path).verify_ms == table.verify_ms   # the damaged file was replaced


def test_garbage_draft_cost_is_profiled_again(small, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    draft = varied_llama(seed=4)
    table_path = cost_module.auto_cost_path(small)
    path = table_path.with_name(f"{table_path.stem}--draft-{draft.name}.json")
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "verify_ms": ["x"]}')
    ms, where = cost_module.draft_token_ms(small, draft)
    assert ms > 0 and where == str(path) and cost_module.CostTable.load(path).ms(1) == ms


def test_a_cost_table_the_user_gives_is_still_refused(small, tmp_path):
    given = tmp_path / "mine.json"
    given.write_text("{half a table")
    with pytest.raises(ConfigError, match=r"^cost_table='.*mine\.json' is invalid: could not be read"):
        cost_module.load_table(small, str(given), 4)


def test_damaged_distillation_cache_is_made_again(small, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    prompts = [[1, 2, 3], [4, 5]]
    data = generate_distill(small, prompts, answer_tokens=4, batch_size=2, progress=False)
    for cached in [*(tmp_path / "distill").glob("*.pt"), *(tmp_path / "distill").glob("answers-*.npz")]:
        cached.write_bytes(cached.read_bytes()[:100])                # cut short
    again = generate_distill(small, prompts, answer_tokens=4, batch_size=2, progress=False)
    assert torch.equal(again.tokens, data.tokens)


@pytest.fixture
def converting(tmp_path, monkeypatch):
    """_load_gguf on a stand-in GGUF file whose conversion (counted) is a tiny word model's."""
    word = build_word_model_dir(tmp_path / "word")
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(path):
        calls.append(path)
        return models._load_dir(str(word), torch.float32, trust_remote_code=False, local_only=True)

    monkeypatch.setattr(models, "_convert", convert)
    return gguf, calls


def damage_conversion(folder: Path, how: str) -> None:
    weights = folder / "model.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])           # cut short: its header says more
    elif how == "no-config":
        (folder / "config.json").unlink()
    elif how == "broken-config":
        (folder / "config.json").write_text("{")
    elif how == "no-tokenizer":
        (folder / "tokenizer_config.json").unlink()
    else:                                                            # NaN weights
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}
        save_file(state, str(weights), metadata={"format": "pt"})


@pytest.mark.parametrize("how", ["truncated", "no-config", "broken-config", "no-tokenizer", "nan"])
def test_damaged_converted_model_is_converted_again(how, converting):
    gguf, calls = converting
    model, _ = models._load_gguf(gguf, torch.float32)
    folder = models._gguf_cache_dir(gguf)
    assert len(calls) == 1 and (folder / "model.safetensors").is_file()
    models._load_gguf(gguf, torch.float32)
    assert len(calls) == 1                                           # the cached copy served
    damage_conversion(folder, how)
    again, _ = models._load_gguf(gguf, torch.float32)
    assert len(calls) == 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    models._load_gguf(gguf, torch.float32)
    assert len(calls) == 2                                           # the mended copy serves again


# ------------------------------------------------------------------------------ server paths

def test_server_side_files_are_named_by_their_name(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path / "cache"))
    assert shown_path(ASSETS / "dspark-smollm2-135m.safetensors") == "dspark-smollm2-135m.safetensors"
    assert shown_path(tmp_path / "cache" / "cost" / "t.json") == "t.json"
    assert shown_path(tmp_path / "mine.safetensors") == str(tmp_path / "mine.safetensors")   # the user's own
    assert shown_path("relative/mine.safetensors") == "relative/mine.safetensors"


def test_missing_embedded_model_file_names_no_server_path(tmp_path, monkeypatch):
    class Dist:
        def locate_file(self, name):
            return tmp_path / "site-packages" / name

    monkeypatch.setattr(models.importlib.metadata, "distribution", lambda name: Dist())
    with pytest.raises(ConfigError) as caught:
        models.embedded_gguf_path()
    assert str(tmp_path) not in str(caught.value)
    assert str(caught.value) == (f"model='default' is invalid: {models.EMBEDDED_GGUF} is missing; "
                                 f"reinstall {models.EMBEDDED_DIST}")


def test_a_cost_table_kept_on_the_server_is_named_by_its_name(small, tmp_path, monkeypatch):
    """The app keeps an uploaded cost table in the cache: its error names the file, not the server's folder."""
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    upload = tmp_path / "cost" / "uploads" / "mine.json"
    upload.parent.mkdir(parents=True)
    upload.write_text("{half a table")
    with pytest.raises(ConfigError) as caught:
        cost_module.load_table(small, str(upload), 4)
    assert str(caught.value).startswith("cost_table='mine.json' is invalid: could not be read (Expecting")
    missing = tmp_path / "cost" / "uploads" / "gone.json"
    with pytest.raises(ConfigError) as caught:
        cost_module.load_table(small, str(missing), 4)
    assert str(caught.value) == "cost_table='gone.json' is invalid: could not be read (No such file or directory)"


def test_a_shipped_calibration_file_is_named_by_its_name(tmp_path, monkeypatch):
    from decoding.drafters.feature_lattice import HeadCalibration

    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    broken = tmp_path / "head.calibration.json"
    broken.write_text("[]")
    with pytest.raises(ConfigError, match=r"^calibration='head\.calibration\.json' is invalid: is not a "):
        HeadCalibration.load(broken)


def test_cli_run_with_an_unwritable_cache_warns_in_one_line(tmp_path, monkeypatch, capsys, fresh_warning):
    from word_models import PROMPT

    from decoding.__main__ import main

    word = build_word_model_dir(tmp_path / "word")
    unwritable_cache(tmp_path, monkeypatch)
    capsys.readouterr()                                              # the model's own writing progress
    code = main(["run", "--model", str(word), "--prompt", PROMPT, "--max-new-tokens", "4", "--strategy",
                 "speculative", "--draft", "lookup", "--gamma-policy", "cost", "--cost-table", "auto"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 0 and len(lines) == 1 and lines[0].startswith("warning: the cache folder "), err
    assert "working without it" in lines[0]


def test_a_reinstalled_gguf_leaves_one_converted_copy(converting, tmp_path):
    """A reinstall gives the GGUF file a new time, so a new key: the copies of its earlier versions (and
    unrecorded ones of the same name, from before the record, and those of a file that is gone) are removed
    once the new copy is saved; a copy of another existing file of the same name stays."""
    gguf, calls = converting
    models._load_gguf(gguf, torch.float32)
    first = models._gguf_cache_dir(gguf)
    unrecorded = first.with_name(f"{gguf.stem}-0123456789ab")
    unrecorded.mkdir()
    elsewhere = first.with_name(f"{gguf.stem}-fedcba987654")
    elsewhere.mkdir()
    other = tmp_path / "other" / gguf.name
    other.parent.mkdir()
    other.write_bytes(b"")
    (elsewhere / models.SOURCE_RECORD).write_text(json.dumps({"gguf": str(other)}))
    gone = first.with_name(f"{gguf.stem}-aaaaaaaaaaaa")                # its GGUF's install was removed
    gone.mkdir()
    (gone / models.SOURCE_RECORD).write_text(json.dumps({"gguf": str(tmp_path / "removed" / gguf.name)}))
    unrelated = first.with_name("another-model-0123456789ab")
    unrelated.mkdir()
    os.utime(gguf, ns=(1, 1))                                       # as a reinstall would
    models._load_gguf(gguf, torch.float32)
    second = models._gguf_cache_dir(gguf)
    assert second != first and len(calls) == 2
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([second.name, elsewhere.name, unrelated.name])
    assert json.loads((second / models.SOURCE_RECORD).read_text())["gguf"] == str(gguf.resolve())


def test_profiled_cost_tables_are_bounded_least_recently_used_first(tmp_path):
    """Each model, device, dtype and kernel plan gets its own auto table, so a machine that tries many models
    (or a test suite's temporary ones) would gather them without end: the cost folder keeps the
    MAX_AUTO_TABLES most recently used; uploads (a folder of their own) are not counted."""
    from decoding.runtime import cost_table
    from decoding.runtime.files import touch

    folder = tmp_path / "cost"
    (folder / "uploads").mkdir(parents=True)
    table = cost_table.CostTable(verify_ms=(1.0, 2.0), source="test")
    old = []
    for i in range(cost_table.MAX_AUTO_TABLES + 5):
        path = folder / f"model-{i}.json"
        table.save(path)
        os.utime(path, (1000 + i, 1000 + i))
        old.append(path)
    touch(old[0])                                                  # the oldest, just used again
    cost_table.save_auto(table, folder / "new.json")
    kept = {p.name for p in folder.glob("*.json")}
    assert len(kept) == cost_table.MAX_AUTO_TABLES and "new.json" in kept and "model-0.json" in kept
    assert not {f"model-{i}.json" for i in range(1, 7)} & kept and (folder / "uploads").is_dir()


def test_a_cache_file_named_after_a_model_names_no_folder_of_its_path():
    """A model loaded from a folder gets cache files named by the folder's last part and a hash of the
    whole path: the auto cost table's name, which traces record (`cost_source`), carries no server folder
    even in mangled form, and two models of the same name in different folders keep apart."""
    from types import SimpleNamespace

    from decoding.runtime.cost_table import auto_cost_path
    from decoding.runtime.paths import gemm_plan_path

    def named(path: str) -> str:
        return auto_cost_path(SimpleNamespace(name=path, device="cpu", dtype=torch.float32)).name

    served = named("/srv/class-2026/models/my-model")
    assert served.startswith("my-model-") and "srv" not in served and "class-2026" not in served
    assert named("/home/other/my-model") != served and named("default") == "default-cpu-float32.json"
    assert "srv" not in gemm_plan_path("/srv/class-2026/models/my-model").name
