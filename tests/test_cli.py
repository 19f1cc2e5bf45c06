"""CLI contract: run/compare print text + summary and write the trace; bad input is one line naming the
parameter, exit status 2, no traceback."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "decoding", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args,param", [
    (["--prompt", ""], "prompt"),
    (["--prompt", "   "], "prompt"),
    (["--prompt", "hi", "--strategy", "sample", "--top-p", "1.5"], "top_p"),
    (["--prompt", "hi", "--strategy", "sample", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--strategy", "sample", "--top-k", "-1"], "top_k"),
    (["--prompt", "hi", "--strategy", "sample", "--temperature", "-0.5"], "temperature"),
    (["--prompt", "hi", "--strategy", "sample", "--min-p", "2"], "min_p"),
    (["--prompt", "hi", "--strategy", "beam", "--num-beams", "0"], "num_beams"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "hi", "--model", "no-such-org/no-such-model"], "model"),
    (["--prompt", "hi", "--model", "/nonexistent/model.gguf"], "model"),
    (["--prompt", "hi", "--top-k", "abc"], "--top-k"),
])
@pytest.mark.slow
def test_bad_input_one_line_exit_2(args, param):
    res = cli("run", *args)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert param in lines[0] and "Traceback" not in res.stderr


@pytest.mark.slow
def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    res = cli("run", "--prompt", "hi", "--model", str(bad))
    assert res.returncode == 2 and "gguf_file" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_dir_without_weights(tmp_path):
    res = cli("run", "--prompt", "hi", "--model", str(tmp_path))
    assert res.returncode == 2 and "no weights" in res.stderr


@pytest.mark.real
def test_prompt_longer_than_context():
    res = cli("run", "--prompt", "word " * 9000, "--no-chat-template")
    assert res.returncode == 2 and res.stderr.startswith("error: prompt=") and "context" in res.stderr


@pytest.mark.real
def test_run_writes_trace(tmp_path):
    out = tmp_path / "t.json"
    res = cli("run", "--prompt", "Say hello.", "--max-new-tokens", "8", "--strategy", "sample",
              "--temperature", "0.7", "--top-p", "0.9", "--seed", "3", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "[sample] " in res.stdout and "tok/s" in res.stdout
    data = json.loads(out.read_text())
    assert data["strategy"] == "sample" and len(data["output_ids"]) == data["stats"]["new_tokens"]


@pytest.mark.real
def test_compare_prints_table(tmp_path):
    out = tmp_path / "c.json"
    res = cli("compare", "--prompt", "Say hello.", "--max-new-tokens", "6", "--strategy", "greedy",
              "--strategy", "sample", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith(("greedy", "sample"))]
    assert len(rows) == 2
    assert [t["strategy"] for t in json.loads(out.read_text())] == ["greedy", "sample"]


@pytest.mark.slow
def test_dspark_on_another_model_runs_training_free_and_says_so(tmp_path):
    """The headline strategy at its defaults on a model no shipped drafter was trained for."""
    from bench.tiny_model import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "tiny")
    res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--strategy", "dspark", "--max-new-tokens", "12")
    assert res.returncode == 0, res.stderr
    summary = res.stdout.strip().splitlines()[-1]
    assert summary.startswith("[dspark]") and "sources lookup+recycling (auto: no shipped drafter" in summary
    res = cli("run", "--prompt", "Say hi.", "--model", str(model), "--strategy", "dspark", "--drafter", "feature")
    assert res.returncode == 2 and res.stderr.startswith("error: drafter='feature' is invalid: was trained for another")
