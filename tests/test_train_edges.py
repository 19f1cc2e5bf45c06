"""The trainers at their edges: every flag (finite, in range), --out and its model card are checked before
the model loads and the data is made; checks that need the model run before the data, not after it;
non-finite weights are never written, and a weights file holding them is refused when loaded."""
from __future__ import annotations

import os

import pytest
import torch
from cli_support import cli_main, one_line
from dspark_helpers import one_thread, varied_llama
from weights_support import OTHER_TENSOR, given, load_weights, nan_copy, weights  # noqa: F401  (weights: fixture)
from word_models import build_word_model_dir

import decoding.runtime.models as models
from decoding.core.errors import ConfigError
from decoding.runtime.files import atomic_path, check_writable, write_text_atomic
from decoding.runtime.weights_file import save_weights

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def word(tmp_path_factory):
    return build_word_model_dir(tmp_path_factory.mktemp("train-edges") / "word")


@pytest.fixture(scope="module")
def lm(word):
    return models.load(models.ModelSpec(str(word)))


@pytest.fixture
def no_load(monkeypatch):
    """Loading the model fails the test: the bad input must be refused before."""
    def load_(spec):
        raise AssertionError(f"the model was loaded ({spec.name}) before the bad input was refused")

    monkeypatch.setattr(models, "load", load_)


def no_data(monkeypatch, module) -> None:
    """Making the distillation data fails the test: the bad input must be refused before."""
    def distill_set(*args, **kwargs):
        raise AssertionError("the data was made before the bad input was refused")

    monkeypatch.setattr(module, "distill_set", distill_set)


# ------------------------------------------------------------------------------ flags

@pytest.mark.parametrize("trainer,flag,value,line", [
    ("parallel", "--lr", "nan", "lr=nan is invalid: must be a finite number > 0"),
    ("parallel", "--lr", "-0.01", "lr=-0.01 is invalid: must be a finite number > 0"),
    ("parallel", "--lr", "inf", "lr=inf is invalid: must be a finite number > 0"),
    ("feature", "--lr", "inf", "lr=inf is invalid: must be a finite number > 0"),
    ("draft", "--lr", "inf", "lr=inf is invalid: must be a finite number > 0"),
    ("draft", "--lr", "nan", "lr=nan is invalid: must be a finite number > 0"),
    ("parallel", "--soft-weight", "-1", "soft_weight=-1.0 is invalid: must be a finite number >= 0"),
    ("parallel", "--conf-weight", "nan", "conf_weight=nan is invalid: must be a finite number >= 0"),
    ("draft", "--soft-weight", "inf", "soft_weight=inf is invalid: must be a finite number >= 0"),
    ("feature", "--max-minutes", "inf", "max_minutes=inf is invalid: must be a finite number > 0"),
    ("draft", "--max-minutes", "nan", "max_minutes=nan is invalid: must be a finite number > 0"),
    ("feature", "--decay", "nan", "decay=nan is invalid: must be a finite number > 0"),
    ("feature", "--noise", "inf", "noise=inf is invalid: must be a finite number >= 0"),
    ("parallel", "--gen-temperature", "-1", "gen_temperature=-1.0 is invalid: must be a finite number >= 0"),
    ("parallel", "--rank", "0", "rank=0 is invalid: must be an integer >= 1"),
    ("parallel", "--gamma-max", "0", "gamma_max=0 is invalid: must be an integer >= 1"),
    ("draft", "--adapters", "-1", "adapters=-1 is invalid: must be an integer >= 0"),
])
def test_trainer_flags_are_refused_before_the_model_loads(trainer, flag, value, line, word, tmp_path, capsys,
                                                           no_load):
    code, _, err = cli_main(["train", trainer, "--model", str(word), "--out", str(tmp_path / "w.safetensors"),
                             flag, value], capsys)
    assert code == 2 and one_line(err) == f"error: {line}"


@pytest.mark.parametrize("trainer", ["parallel", "draft", "feature"])
def test_trainer_out_name_too_long_before_the_model_loads(trainer, word, tmp_path, capsys, no_load):
    out = tmp_path / ("w" * 300 + ".safetensors")
    code, _, err = cli_main(["train", trainer, "--model", str(word), "--out", str(out)], capsys)
    line = one_line(err)
    assert code == 2 and line.startswith("error: out='") and "its file name is 312 bytes long; the limit here is 255" \
        in line, line
    assert len(line) < 250                                              # shortened, not 300 characters of w


def test_trainer_model_card_name_is_checked_too(word, tmp_path, capsys, no_load):
    """--out without a suffix, 253 bytes long: the weights fit, but the card beside it (.md) would not."""
    out = tmp_path / ("w" * 253)
    code, _, err = cli_main(["train", "draft", "--model", str(word), "--out", str(out)], capsys)
    line = one_line(err)
    assert code == 2 and "its file name is 256 bytes long; the limit here is 255" in line, line


def test_head_calibration_flags_and_out_before_the_model_loads(tmp_path, capsys, no_load):
    code, _, err = cli_main(["train", "head-calibration", "--gamma", "0"], capsys)
    assert code == 2 and one_line(err) == "error: gamma=0 is invalid: must be an integer >= 1"
    code, _, err = cli_main(["train", "head-calibration", "--top-k", "-2"], capsys)
    assert code == 2 and one_line(err) == "error: top_k=-2 is invalid: must be an integer >= 1"
    for bad in ("nan", "-0.5", "9"):
        code, _, err = cli_main(["train", "head-calibration", "--temperature", bad], capsys)
        assert code == 2 and one_line(err).startswith(f"error: temperature={float(bad)} is invalid: must be a number")
    out = tmp_path / "nodir" / "c.json"
    code, _, err = cli_main(["train", "head-calibration", "--out", str(out)], capsys)
    assert code == 2 and one_line(err).startswith(f"error: out='{out}' is invalid: its directory ")


def test_head_calibration_for_another_model_checks_its_drafter_before_the_model_loads(word, tmp_path, capsys,
                                                                                    no_load, monkeypatch):
    """--model without --draft calibrates the file `train feature --model` writes by default (here: none);
    --draft must be a feature drafter's weights."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main(["train", "head-calibration", "--model", str(word)], capsys)
    assert code == 2 and one_line(err) == ("error: draft='feature-word.safetensors' is invalid: has no feature-drafter "
                                           "weights file: train one with `python -m decoding train feature`")
    notes = tmp_path / "notes.txt"
    notes.write_text("not weights\n")
    code, _, err = cli_main(["train", "head-calibration", "--model", str(word), "--draft", str(notes)], capsys)
    assert code == 2 and one_line(err).startswith(f"error: draft='{notes}' is invalid: could not be read (")


def test_answers_out_before_the_model_loads(word, tmp_path, capsys, no_load):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    code, _, err = cli_main(["train", "answers", "--model", str(word), "--out", str(blocker)], capsys)
    line = one_line(err)
    assert code == 2 and line.startswith(f"error: out='{blocker}' is invalid: could not be made a folder"), line


# ------------------------------------------------------------------------------ checks that need the model

def test_each_train_command_reaches_its_own_parser(capsys):
    """decoding/train/cli.py's table: each row's module parses that command's flags (its --help names it), and
    `train` alone lists every command; an unknown name is refused with the list (status 2)."""
    from decoding.train.cli import COMMANDS, main_cli

    names = [c.name for c in COMMANDS]
    assert names == ["parallel", "draft", "feature", "eval-feature", "head-calibration", "answers"]
    for name in names:
        with pytest.raises(SystemExit) as done:
            main_cli([name, "--help"])
        assert done.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: python -m decoding train {name} ")
    assert main_cli(["nope"]) == 2
    listed = capsys.readouterr().err.splitlines()
    assert [line.split()[0] for line in listed[1:]] == names


def test_parallel_shape_is_checked_before_the_data(monkeypatch, tmp_path):
    from decoding.train import parallel

    no_data(monkeypatch, parallel)
    settings = parallel.TrainSettings(layers=1, trunk=30)        # 8 heads cannot split a trunk of 30
    with pytest.raises(ConfigError, match=r"^heads=8 is invalid: must divide trunk \(30\)"):
        parallel.train_parallel(varied_llama(), settings, tmp_path / "p.safetensors", prompts=[[1, 2]],
                                progress=False)


def test_shallow_layers_are_checked_before_the_data(monkeypatch, tmp_path):
    from decoding.train import shallow

    no_data(monkeypatch, shallow)
    with pytest.raises(ConfigError, match=r"^draft_layers=5 is invalid: must be an integer in \[1, 1\]"):
        shallow.train_shallow(varied_llama(), shallow.DraftSettings(layers=5), tmp_path / "s.safetensors",
                              prompts=[[1, 2]], progress=False)


def test_feature_init_of_another_shape_is_refused_before_the_data(monkeypatch, tmp_path):
    from decoding.drafters.feature_net import FeatureNet, FeatureShape, save_feature
    from decoding.train import feature

    init = tmp_path / "init.safetensors"
    save_feature(FeatureNet(FeatureShape(32, width=16, mlp=32, blocks=1), range(64)), init)
    no_data(monkeypatch, feature)
    settings = feature.FeatureSettings(width=24, mlp=32, blocks=1, init=str(init))
    with pytest.raises(ConfigError, match=r"^init='.*init\.safetensors' is invalid: does not fit this drafter's "
                                          r"shape \(width 16, not 24\)"):
        feature.train_feature(varied_llama(), settings, tmp_path / "f.safetensors", prompts=[[1, 2]], progress=False)


# ------------------------------------------------------------------------------ what --out may replace

def test_weights_to_a_pipe_are_written_in_place(tmp_path):
    """save_weights honours atomic_path's promise: a pipe (or a device) is written in place, not replaced by a
    regular file (safetensors' save_file renames a file over it)."""
    import stat

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)      # a reader, so that the writer's open does not block
    try:
        save_weights({"a": torch.ones(3)}, pipe, {"format": "x"})
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert b'"format":"x"' in got


def test_a_trainer_replaces_its_own_files(lm, tmp_path):
    """Negative control of the train-out-* cases (test_bad_input): training again to the same --out replaces the
    drafter file and the model card a trainer wrote, and a new name passes."""
    from decoding.drafters.feature_net import FeatureNet, FeatureShape, save_feature
    from decoding.train.common import check_outputs

    out = tmp_path / "f.safetensors"
    assert check_outputs(out) == out
    save_feature(FeatureNet(FeatureShape(32, 8, 8, 1), range(8)), out)
    out.with_suffix(".md").write_text("# Feature drafter\n\nGenerated by `python -m decoding train feature` ...\n")
    assert check_outputs(out) == out
    out.with_suffix(".md").write_text("# Feature drafter, my notes\n")
    with pytest.raises(ConfigError, match="which is not a model card"):
        check_outputs(out)


# ------------------------------------------------------------------------------ non-finite weights

@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e6])      # 1e6 overflows float16
def test_non_finite_weights_are_not_written(value, tmp_path):
    path = tmp_path / "w.safetensors"
    state = {"ok": torch.ones(3), "bad": torch.tensor([0.5, value, value])}
    with pytest.raises(ConfigError) as caught:
        save_weights(state, path, {"format": "x"})
    assert str(caught.value) == (f"out='{path}' is invalid: not written: 2 in 'bad' of the weights are NaN or "
                                 "infinite in float16 (training diverged: try a lower --lr)")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_a_drafter_with_nan_weights_is_not_saved(tmp_path):
    """A trainer's own writer (what train_parallel saves) goes through the same check."""
    from decoding.train import parallel

    out = tmp_path / "p.safetensors"
    drafter = parallel.ParallelDrafter(parallel.DrafterShape(32, 64, 2, 4, 8, 8), vocab_ids=[1, 2, 3])
    with torch.no_grad():
        for p in drafter.parameters():
            p.fill_(float("nan"))
    with pytest.raises(ConfigError, match=r"^out='.*p\.safetensors' is invalid: not written: "):
        drafter.save(out)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["shallow", "feature", "parallel"])
def test_nan_weights_are_refused_at_load(kind, lm, weights, tmp_path):
    path = tmp_path / f"{kind}-nan.safetensors"
    nan_copy(weights[kind], path, OTHER_TENSOR[kind])
    with pytest.raises(ConfigError) as caught:
        load_weights(kind, path, lm)
    param = "drafter" if kind == "parallel" else "draft"
    line = one_line(str(caught.value))
    assert line.startswith(f"{param}='{given(kind, path)}' is invalid: holds NaN or infinite weights (") and \
        line.endswith(f" in '{OTHER_TENSOR[kind]}'); train it again"), line


def test_nan_weights_in_the_cache_are_named_by_file_name(lm, weights, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    path = tmp_path / "drafters" / "p.safetensors"
    path.parent.mkdir()
    nan_copy(weights["parallel"], path, OTHER_TENSOR["parallel"])
    with pytest.raises(ConfigError) as caught:
        load_weights("parallel", path, lm)
    assert str(caught.value).startswith("drafter='p.safetensors' is invalid: holds NaN") and str(tmp_path) not in \
        str(caught.value)


# ------------------------------------------------------------------------------ long names

def test_out_name_too_long_is_one_line_naming_out(tmp_path):
    for out in (tmp_path / ("x" * 300), tmp_path / ("d" * 256) / "t.json"):
        with pytest.raises(ConfigError) as caught:
            check_writable(out, "out")
        assert "bytes long; the limit here is 255" in one_line(str(caught.value))


def test_longest_valid_names_are_written(tmp_path):
    """A name within the limit is written, whatever its characters: the temporary file beside it is short."""
    for name in ("語" * 85, "x" * 255):                                    # 255 bytes each
        path = tmp_path / name
        assert len(os.fsencode(name)) == 255
        check_writable(path, "out")
        write_text_atomic(path, "kept\n")
        assert path.read_text() == "kept\n"
        with atomic_path(path) as tmp:
            assert len(os.fsencode(tmp.name)) <= 255
            tmp.write_text("again\n")
        assert path.read_text() == "again\n"


def test_eval_feature_weights_are_checked_before_the_model_loads(word, tmp_path, capsys, no_load):
    notes = tmp_path / "notes.txt"
    notes.write_text("not weights\n")
    code, _, err = cli_main(["train", "eval-feature", "--model", str(word), "--weights", str(notes)], capsys)
    assert code == 2 and one_line(err).startswith(f"error: draft='{notes}' is invalid: could not be read (")
