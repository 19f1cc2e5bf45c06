"""The "your model" path (docs/drafters.md): on a model no shipped drafter fits, DSpark and speculative decoding
run at their defaults, and drafters trained for it with `python -m decoding train` are taken by name
(`--drafter feature:FILE`, `parallel:FILE`, `--draft feature:FILE`), each run token-identical to greedy."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--prompt-pool", "templates", "--n-prompts", "32", "--answer-tokens", "16", "--batch-size", "8",
        "--no-progress", "--max-minutes", "0.5"]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "decoding", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_app_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("your_model") / "tiny")


def greedy_text(model) -> str:
    res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--max-new-tokens", "12")
    assert res.returncode == 0, res.stderr
    return res.stdout.rsplit("\n[greedy]", 1)[0]


def test_train_both_drafters_and_decode_with_them(model, tmp_path):
    feature, parallel = tmp_path / "feature.safetensors", tmp_path / "parallel.safetensors"
    done = cli("train", "feature", "--model", str(model), "--out", str(feature), "--steps", "5", "--width", "32",
               "--mlp", "64", *TINY)
    assert done.returncode == 0 and feature.is_file() and feature.with_suffix(".md").is_file(), done.stderr
    done = cli("train", "parallel", "--model", str(model), "--out", str(parallel), "--steps", "5", "--trunk", "32",
               "--width", "32", "--rank", "8", *TINY)
    assert done.returncode == 0 and parallel.is_file() and parallel.with_suffix(".md").is_file(), done.stderr
    want = greedy_text(model)
    for args, label in ((["--strategy", "dspark", "--drafter", f"feature:{feature}"], "sources feature+lookup"),
                        (["--strategy", "dspark", "--drafter", f"parallel:{parallel}+recycling"],
                         "sources parallel+lookup+recycling"),
                        (["--strategy", "speculative", "--draft", f"feature:{feature}"], "[speculative]")):
        res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--max-new-tokens", "12", *args)
        assert res.returncode == 0, (args, res.stderr)
        text, summary = res.stdout.rsplit("\n[", 1)
        assert text == want and label in "[" + summary, (args, summary)


def test_a_bad_max_minutes_is_refused_before_any_data(model, tmp_path):
    res = cli("train", "parallel", "--model", str(model), "--out", str(tmp_path / "p.safetensors"), "--max-minutes",
              "-1")
    assert res.returncode == 2 and res.stderr.startswith("error: max_minutes=-1.0 is invalid")
