"""The "your model" path (docs/drafters.md): on a model no shipped drafter fits, DSpark and speculative decoding
run at their defaults, and drafters trained for it with `python -m decoding train` are taken by name
(`--drafter feature:FILE`, `parallel:FILE`, `--draft feature:FILE`), each run token-identical to greedy; the
feature head is calibrated for it (`train head-calibration --model`), and a file trained for it is refused on
another model of the same shape (by the fingerprint the trainers record)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_main, one_line
from weights_support import rewrite

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--prompt-pool", "templates", "--n-prompts", "32", "--answer-tokens", "16", "--batch-size", "8",
        "--no-progress", "--max-minutes", "0.5"]
OTHER_WEIGHTS = ("was trained for another model (its fingerprint: same architecture and tokenizer, other weights); "
                 'train one for this model (docs/drafters.md "Your model")')


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "decoding", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from bench.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("your_model") / "tiny")


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A model of the tiny model's shape and tokenizer with other weights: the shape check alone lets its
    drafters through."""
    from bench.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("your_model") / "other", seed=1)


@pytest.fixture(scope="module")
def trained(model, tmp_path_factory):
    """{"feature": file, "parallel": file} trained for the tiny model by the CLI (a few seconds each)."""
    out = tmp_path_factory.mktemp("trained")
    files = {"feature": out / "feature.safetensors", "parallel": out / "parallel.safetensors"}
    flags = {"feature": ["--width", "32", "--mlp", "64"], "parallel": ["--trunk", "32", "--width", "32", "--rank", "8"]}
    for kind, path in files.items():
        done = cli("train", kind, "--model", str(model), "--out", str(path), "--steps", "5", *flags[kind], *TINY)
        assert done.returncode == 0 and path.is_file() and path.with_suffix(".md").is_file(), done.stderr
    return files


@pytest.fixture(scope="module")
def greedy_text(model) -> str:
    res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--max-new-tokens", "12")
    assert res.returncode == 0, res.stderr
    return res.stdout.rsplit("\n[greedy]", 1)[0]


@pytest.mark.slow
def test_train_both_drafters_and_decode_with_them(model, trained, greedy_text):
    feature, parallel = trained["feature"], trained["parallel"]
    want = greedy_text
    for args, label in ((["--strategy", "dspark", "--drafter", f"feature:{feature}"], "sources feature+lookup"),
                        (["--strategy", "dspark", "--drafter", f"parallel:{parallel}+recycling"],
                         "sources parallel+lookup+recycling"),
                        (["--strategy", "speculative", "--draft", f"feature:{feature}"], "[speculative]")):
        res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--max-new-tokens", "12", *args)
        assert res.returncode == 0, (args, res.stderr)
        text, summary = res.stdout.rsplit("\n[", 1)
        assert text == want and label in "[" + summary, (args, summary)


@pytest.mark.slow
def test_a_bad_max_minutes_is_refused_before_any_data(model, tmp_path):
    res = cli("train", "parallel", "--model", str(model), "--out", str(tmp_path / "p.safetensors"), "--max-minutes",
              "-1")
    assert res.returncode == 2 and res.stderr.startswith("error: max_minutes=-1.0 is invalid")


@pytest.mark.slow
def test_head_calibration_for_your_model_is_what_dspark_uses(model, trained, greedy_text, tmp_path, capsys):
    """train feature -> train head-calibration --model -> DSpark with --drafter feature:FILE reads the calibration
    written beside FILE (not the identity) and stays token-identical to greedy."""
    import torch

    from decoding.drafters.factory import load_lattice_drafter
    from decoding.drafters.feature_lattice import HeadCalibration
    from decoding.runtime.models import ModelSpec, load
    from decoding.runtime.paths import calibration_path

    feature = tmp_path / "mine.safetensors"
    shutil.copy(trained["feature"], feature)
    shutil.copy(trained["feature"].with_suffix(".md"), feature.with_suffix(".md"))
    code, _, err = cli_main(["train", "head-calibration", "--model", str(model), "--draft", str(feature), "--prompts",
                             "8", "--answer-tokens", "16", "--gamma", "4"], capsys)
    assert code == 0 and calibration_path(feature).is_file(), err
    assert f"head-calibration --model {model} --prompts 8" in feature.with_suffix(".md").read_text()
    written = HeadCalibration.load(calibration_path(feature))
    with torch.inference_mode():
        head = load_lattice_drafter(load(ModelSpec(str(model))), f"feature:{feature}")
    assert head.calibration == written and written != HeadCalibration() and written.sampled is not None
    code, out, err = cli_main(["run", "--prompt", "Say hi.", "--model", str(model), "--max-new-tokens", "12",
                               "--strategy", "dspark", "--drafter", f"feature:{feature}"], capsys)
    assert code == 0, err
    assert out.rsplit("\n[", 1)[0] == greedy_text


@pytest.mark.parametrize("flags,named", [
    (["--strategy", "dspark", "--drafter", "feature:{feature}"], "drafter='feature:{feature}'"),
    (["--strategy", "dspark", "--drafter", "parallel:{parallel}"], "drafter='parallel:{parallel}'"),
    (["--strategy", "speculative", "--draft", "feature:{feature}"], "draft='feature:{feature}'"),
    (["--strategy", "speculative", "--draft", "lookup+feature:{feature}"], "draft='feature:{feature}'"),
])
@pytest.mark.slow
def test_a_drafter_trained_for_another_model_of_its_shape_is_refused(flags, named, other, trained, capsys):
    code, _, err = cli_main(["run", "--model", str(other), "--prompt", "Say hi.", "--max-new-tokens", "4",
                             *[f.format(**trained) for f in flags]], capsys)
    assert code == 2 and one_line(err) == f"error: {named.format(**trained)} is invalid: {OTHER_WEIGHTS}"


def without_fingerprint(path: Path, dst: Path) -> Path:
    """A copy of a drafter file as trainers wrote it before they recorded the target's fingerprint."""
    from safetensors import safe_open

    from decoding.runtime.fingerprint import TARGET_KEY

    with safe_open(str(path), "pt") as fh:
        meta = json.loads(fh.metadata()["meta"])
    assert TARGET_KEY in meta
    rewrite(path, dst, header={"meta": json.dumps({k: v for k, v in meta.items() if k != TARGET_KEY})})
    return dst


@pytest.mark.slow                      # the `trained` fixture trains both drafters
def test_a_file_without_a_fingerprint_keeps_the_shape_check(other, trained, tmp_path, capsys):
    """An older file (no fingerprint) loads on any model of its shape, and is refused by shape on another, in
    one line naming the draft as given (feature:FILE, not 'feature')."""
    from word_models import PROMPT, build_word_model_dir

    old = without_fingerprint(trained["feature"], tmp_path / "old.safetensors")
    old_parallel = without_fingerprint(trained["parallel"], tmp_path / "old-parallel.safetensors")
    base = ["run", "--prompt", "Say hi.", "--max-new-tokens", "4"]
    for flags in (["--strategy", "speculative", "--draft", f"feature:{old}"],
                  ["--strategy", "dspark", "--drafter", f"parallel:{old_parallel}"]):
        code, _, err = cli_main([*base, "--model", str(other), *flags], capsys)
        assert code == 0, err
    word = build_word_model_dir(tmp_path / "word", vocab=64)
    code, _, err = cli_main(["run", "--prompt", PROMPT, "--max-new-tokens", "4", "--model", str(word), "--strategy",
                             "speculative", "--draft", f"feature:{old}"], capsys)
    assert code == 2 and one_line(err).startswith(f"error: draft='feature:{old}' is invalid: was trained for "
                                                  "another model (its tokens reach id "), err
