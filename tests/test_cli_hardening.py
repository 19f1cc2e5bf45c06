"""The command line fails cleanly and loses nothing (issue 28): `--out` is checked before the model loads
and written atomically; Ctrl-C keeps the run so far (exit 130); a prompt that is not UTF-8, a max_memory
that overflows, a damaged weights file, a broken config.json and a flag the strategy does not take are
each one line naming the parameter and the value (exit 2), in the CLI and in the engine."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from cli_support import NOT_UTF8, cli_main, one_line
from dspark_helpers import one_thread
from weights_support import (  # noqa: F401  (weights: fixture)
    BAD_HEADER,
    DROPPED,
    OTHER_TENSOR,
    given,
    load_weights,
    rewrite,
    weights,
)
from word_models import PROMPT, build_word_model_dir

from decoding import __main__ as cli
from decoding.core.config import GreedyConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import from_json
from decoding.runner import RunInterrupted, run, run_lockstep
from decoding.runtime.files import atomic_path, write_text_atomic
from decoding.runtime.models import LM, ModelSpec, load
from decoding.runtime.weights_file import save_weights

ROOT = Path(__file__).resolve().parents[1]
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


# ------------------------------------------------------------------------------ helpers and fixtures

@pytest.fixture(scope="module")
def word(tmp_path_factory) -> Path:
    return build_word_model_dir(tmp_path_factory.mktemp("hardening") / "word")


@pytest.fixture(scope="module")
def lm(word) -> LM:
    return load(ModelSpec(str(word)))


def base(word: Path, *flags: str) -> list[str]:
    return ["run", "--model", str(word), "--prompt", PROMPT, "--max-new-tokens", "4", *flags]


@pytest.fixture
def no_load(monkeypatch):
    """The CLI must refuse before it loads the model: loading fails the test."""
    def load_(spec):
        raise AssertionError(f"the model was loaded ({spec.name}) before the bad input was refused")

    monkeypatch.setattr(cli, "load", load_)


def interrupt_after(monkeypatch, calls_ok: int) -> None:
    """Every llama forward after the first `calls_ok` raises KeyboardInterrupt (Ctrl-C mid-run); the load-time
    warm-up forwards are switched off so that the count is the run's own."""
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LM, "warm_up", lambda self, ids=(): self)
    original, calls = LlamaForCausalLM.forward, [0]

    def forward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] > calls_ok:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "forward", forward)


# ------------------------------------------------------------------------------ --out

def unwritable_dir(tmp_path: Path) -> Path:
    """A directory in which this process cannot create a file (root ignores mode bits: /proc then)."""
    if os.geteuid() == 0:
        return Path("/proc")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked


@pytest.mark.parametrize("where,reason", [
    ("missing-dir", r"its directory .*nodir does not exist"),
    ("a-directory", r"is a directory; give a file path"),
    ("parent-is-a-file", r"notes\.txt is not a directory"),
    ("unwritable-dir", r"no file can be created in "),
])
def test_out_is_checked_before_the_model_loads(where, reason, word, tmp_path, capsys, no_load):
    import re

    (tmp_path / "notes.txt").write_text("notes\n")
    out = {"missing-dir": tmp_path / "nodir" / "t.json", "a-directory": tmp_path,
           "parent-is-a-file": tmp_path / "notes.txt" / "t.json",
           "unwritable-dir": unwritable_dir(tmp_path) / "t.json"}[where]
    for command in (base(word), ["compare", *base(word)[1:], "--strategy", "greedy"]):
        code, _, err = cli_main(command + ["--out", str(out)], capsys)
        line = one_line(err)
        assert code == 2 and line.startswith(f"error: out='{out}' is invalid: "), line
        assert re.search(reason, line), line


def full_disk_write_text(monkeypatch) -> None:
    """Path.write_text as on a full disk: half the text is written, then ENOSPC."""
    def write_text(self, data, encoding=None, errors=None, newline=None):
        with open(self, "w", encoding=encoding) as fh:
            fh.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", write_text)


def test_full_disk_keeps_the_old_trace_and_says_so(word, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.json"
    out.write_text('{"old": "trace"}')
    full_disk_write_text(monkeypatch)
    try:
        code, stdout, err = cli_main(base(word, "--out", str(out)), capsys)
    except OSError:
        pytest.fail("the full disk gave a traceback")
    monkeypatch.undo()
    assert code == 2 and "[greedy] 4 tokens" in stdout
    assert one_line(err) == (f"error: out='{out}' is invalid: could not be written (No space left on device); "
                             "a file already there is unchanged")
    assert out.read_text() == '{"old": "trace"}' and os.listdir(tmp_path) == ["t.json"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_out_on_a_real_full_device_is_one_line(word, capsys):
    code, stdout, err = cli_main(base(word, "--out", "/dev/full"), capsys)
    assert code == 2 and "[greedy] 4 tokens" in stdout
    assert one_line(err).startswith("error: out='/dev/full' is invalid: could not be written (No space left")


def test_out_is_written_whole_and_nothing_else_is_left(word, tmp_path, capsys):
    out = tmp_path / "t.json"
    out.write_text("old")
    out.chmod(0o640)
    code, _, err = cli_main(base(word, "--out", str(out)), capsys)
    assert code == 0, err
    assert len(from_json(out.read_bytes()).steps) == 4 and os.listdir(tmp_path) == ["t.json"]
    assert out.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_atomic_path_keeps_the_old_file_and_removes_its_temporary(failure, tmp_path):
    target = tmp_path / "w.bin"
    target.write_bytes(b"old")
    with pytest.raises(failure), atomic_path(target) as tmp:
        tmp.write_bytes(b"half of the new")
        raise failure()
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["w.bin"]


def test_atomic_write_goes_through_a_symlink(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_weights_writers_are_atomic(tmp_path, monkeypatch):
    """A weights file (drafters, trainers' outputs) that fails mid-write leaves the old file whole."""
    import decoding.runtime.files as files

    target = tmp_path / "drafter.safetensors"
    save_weights({"w": torch.ones(3)}, target, {"format": "x"})
    before = target.read_bytes()

    def flush(path):                 # the new file written, then the disk is full when it is flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_flush", flush)
    with pytest.raises(OSError):
        save_weights({"w": torch.zeros(3)}, target, {"format": "x"})
    assert target.read_bytes() == before and os.listdir(tmp_path) == ["drafter.safetensors"]


# ------------------------------------------------------------------------------ Ctrl-C

def test_ctrl_c_keeps_the_text_and_trace_so_far(word, tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.json"
    interrupt_after(monkeypatch, 3)                # prefill + 2 steps: step 3's forward is interrupted
    code, stdout, err = cli_main(base(word, "--max-new-tokens", "8", "--out", str(out)), capsys)
    assert code == 130, err
    assert one_line(err) == f"interrupted: stopped by Ctrl-C; the text so far (3 steps) is above, the trace in {out}"
    kept = from_json(out.read_bytes())
    assert len(kept.steps) == 3 and kept.stop_reason == "stopped" and kept.error is None
    assert stdout.splitlines()[0] == kept.text and "stop: stopped" in stdout


def test_ctrl_c_in_compare_keeps_every_lane(word, tmp_path, capsys, monkeypatch):
    out = tmp_path / "c.json"
    interrupt_after(monkeypatch, 4)                # two turns of both lanes, then greedy's third step
    code, stdout, err = cli_main(["compare", *base(word, "--max-new-tokens", "8", "--out", str(out))[1:],
                                  "--strategy", "greedy", "--strategy", "sample"], capsys)
    assert code == 130, err
    assert one_line(err).startswith("interrupted: stopped by Ctrl-C; the runs so far are above")
    kept = json.loads(out.read_text())
    assert [t["stop_reason"] for t in kept] == ["stopped", "stopped"]
    assert [len(t["steps"]) for t in kept] == [2, 2]


def test_ctrl_c_while_loading_is_one_line(word, capsys, monkeypatch):
    def load_(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load", load_)
    code, _, err = cli_main(base(word), capsys)
    assert code == 130 and one_line(err) == "interrupted: stopped by Ctrl-C"


def interrupted(call) -> RunInterrupted:
    """The RunInterrupted that call() raises (a KeyboardInterrupt, so Ctrl-C still stops a caller's loop)."""
    try:
        call()
    except RunInterrupted as stop:
        assert isinstance(stop, KeyboardInterrupt)
        return stop
    except KeyboardInterrupt:
        pytest.fail("a plain KeyboardInterrupt: the trace so far is lost")
    pytest.fail("the run was not interrupted")


def test_engine_run_hands_back_the_trace_on_ctrl_c(lm):
    def on_event(event):
        if on_event.seen == 2:
            raise KeyboardInterrupt
        on_event.seen += 1

    on_event.seen = 0
    kept = interrupted(lambda: run(lm, [1, 2, 3], GreedyConfig(max_new_tokens=8), on_event=on_event)).result
    assert len(kept.steps) == 3 and kept.stop_reason == "stopped"
    clean = run(lm, [1, 2, 3], GreedyConfig(max_new_tokens=8))
    assert kept.output_ids == clean.output_ids[:3]


def test_engine_lockstep_hands_back_every_trace_on_ctrl_c(lm):
    def on_event(label, event):
        if label == "b":
            raise KeyboardInterrupt

    lanes = {"a": (GreedyConfig(max_new_tokens=8), {}), "b": (GreedyConfig(max_new_tokens=8, seed=1), {})}
    traces = interrupted(lambda: run_lockstep(lm, [1, 2, 3], lanes, on_event=on_event)).result
    assert {k: (len(t.steps), t.stop_reason) for k, t in traces.items()} == {"a": (1, "stopped"), "b": (1, "stopped")}


@pytest.mark.slow
def test_sigint_to_a_real_process(word, tmp_path):
    """A real SIGINT, sent by the process to itself during its 4th forward: exit 130, no traceback, the
    text and the trace of the steps before it. The child restores Python's Ctrl-C handler first: a suite
    started in the background (nohup, `&`) passes SIGINT on ignored, and Python then installs none."""
    out = tmp_path / "t.json"
    script = textwrap.dedent("""
        import os, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)   # as under a terminal (see the docstring)
        from transformers import LlamaForCausalLM
        from decoding.runtime.models import LM
        LM.warm_up = lambda self, ids=(): self
        original, calls = LlamaForCausalLM.forward, [0]
        def forward(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == 4:
                os.kill(os.getpid(), signal.SIGINT)
            return original(self, *args, **kwargs)
        LlamaForCausalLM.forward = forward
        from decoding.__main__ import main
        sys.exit(main(sys.argv[1:]))
    """)
    res = subprocess.run([sys.executable, "-c", script, *base(word, "--max-new-tokens", "8", "--out", str(out))],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 130, res.stderr
    assert one_line(res.stderr).startswith("interrupted: stopped by Ctrl-C; the text so far (3 steps)")
    kept = from_json(out.read_bytes())
    assert len(kept.steps) == 3 and kept.stop_reason == "stopped"
    assert res.stdout.splitlines()[0] == kept.text


# ------------------------------------------------------------------------------ other inputs

def test_prompt_that_is_not_utf8(word, lm, capsys):
    code, _, err = cli_main(["run", "--model", str(word), "--prompt", NOT_UTF8], capsys)
    assert code == 2
    assert one_line(err).startswith(r"error: prompt='w1 \udcff w2' is invalid: is not UTF-8 text (character 3")
    with pytest.raises(ConfigError, match=r"^prompt=.* is not UTF-8 text"):
        lm.encode(NOT_UTF8)


@pytest.mark.parametrize("budget,reason", [
    ("cpu=1" + "0" * 400 + "GiB", "is too large"),
    ("cpu=99999999999999999999", "is too large"),
    ("1" * 5000 + "=1GiB", "give DEVICE=SIZE pairs"),
])
def test_max_memory_that_overflows(budget, reason, word, capsys, no_load):
    with pytest.raises(ConfigError, match=f"^max_memory=.* is invalid: .*{reason}"):
        ModelSpec(str(word), device_map="auto", max_memory=budget)
    code, _, err = cli_main(base(word, "--device-map", "auto", "--max-memory", budget), capsys)
    assert code == 2 and one_line(err).startswith("error: max_memory=") and reason in err


# damaged weights files: (loader, damage) -> the file; every one must be `param=PATH could not be read`

def damaged(kind: str, damage: str, good: Path, tmp: Path) -> Path:
    path = tmp / f"{kind}-{damage}.safetensors"
    if damage == "text":
        path.write_text("these are notes, not weights\n")
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    elif damage == "missing-ids":
        rewrite(good, path, drop=DROPPED[kind])
    elif damage == "missing-weight":
        rewrite(good, path, drop=OTHER_TENSOR[kind])
    else:
        rewrite(good, path, header=BAD_HEADER[kind])
    return path


@pytest.mark.parametrize("damage", ["text", "empty", "truncated", "missing-ids", "missing-weight", "bad-header"])
@pytest.mark.parametrize("kind", ["shallow", "feature", "parallel"])
def test_damaged_weights_file_is_one_line_naming_it(kind, damage, lm, weights, tmp_path):
    path = damaged(kind, damage, weights[kind], tmp_path)
    param = "drafter" if kind == "parallel" else "draft"
    with pytest.raises(ConfigError) as caught:
        load_weights(kind, path, lm)
    line = one_line(str(caught.value))
    assert line.startswith(f"{param}='{given(kind, path)}' is invalid: could not be read ("), line


def test_good_weights_files_still_load(lm, weights):
    for kind, path in weights.items():
        assert load_weights(kind, path, lm) is not None


@pytest.mark.parametrize("flags,named", [
    (["--strategy", "speculative", "--draft", "shallow:{path}"], "draft='shallow:{path}'"),
    (["--strategy", "speculative", "--draft", "feature:{path}"], "draft='feature:{path}'"),
    (["--strategy", "dspark", "--drafter", "{path}"], "drafter='{path}'"),
])
def test_cli_damaged_draft_file(flags, named, word, tmp_path, capsys):
    """Named as the user gave it."""
    path = tmp_path / "notes.txt"
    path.write_text("notes\n")
    code, _, err = cli_main(base(word, *[f.format(path=path) for f in flags]), capsys)
    assert code == 2
    assert one_line(err).startswith(f"error: {named.format(path=path)} is invalid: could not be read (")


@pytest.mark.parametrize("config,reason", [
    ("{broken", "its config.json could not be read (Expecting property name"),
    ("[1, 2]", "its config.json could not be read (not a JSON object)"),
    (None, "directory has no config.json"),
])
def test_model_dir_with_a_broken_config(config, reason, word, tmp_path, capsys):
    bad = tmp_path / "model"
    shutil.copytree(word, bad)
    if config is None:
        (bad / "config.json").unlink()
    else:
        (bad / "config.json").write_text(config)
    with pytest.raises(ConfigError) as caught:
        load(ModelSpec(str(bad)))
    assert str(caught.value).startswith(f"model='{bad}' is invalid: {reason}")
    assert "DECODESCOPE_ALLOW_DOWNLOAD" not in str(caught.value)
    code, _, err = cli_main(["run", "--model", str(bad), "--prompt", PROMPT], capsys)
    assert code == 2 and one_line(err) == f"error: {caught.value}"


@pytest.mark.parametrize("command,flags,line", [
    ("run", ["--num-beams", "4"], "num_beams=4 is invalid: does not apply to strategy 'greedy' (only to beam)"),
    ("run", ["--strategy", "sample", "--gamma", "3"],
     "gamma=3 is invalid: does not apply to strategy 'sample' (only to speculative, dspark)"),
    ("run", ["--temperature", "0.5"],
     "temperature=0.5 is invalid: does not apply to strategy 'greedy' (only to sample, speculative, dspark)"),
    ("run", ["--early-stopping"], "early_stopping=True is invalid: does not apply to strategy 'greedy' (only to beam)"),
    ("run", ["--strategy", "speculative", "--drafter", "default"],
     "drafter='default' is invalid: does not apply to strategy 'speculative' (only to dspark)"),
    ("run", ["--strategy", "dspark", "--draft", "lookup"],
     "draft='lookup' is invalid: does not apply to strategy 'dspark' (only to speculative)"),
    ("compare", ["--strategy", "greedy", "--strategy", "sample", "--num-beams", "3"],
     "num_beams=3 is invalid: does not apply to strategies 'greedy', 'sample' (only to beam)"),
])
def test_flag_the_strategy_does_not_take(command, flags, line, word, capsys, no_load):
    code, _, err = cli_main([command, *base(word)[1:], *flags], capsys)
    assert code == 2 and one_line(err) == f"error: {line}"


def test_flags_left_out_and_flags_one_lane_takes_are_fine(word, capsys):
    code, _, err = cli_main(base(word, "--strategy", "beam"), capsys)
    assert code == 0, err
    code, stdout, err = cli_main(["compare", *base(word)[1:], "--strategy", "greedy", "--strategy", "beam",
                                  "--num-beams", "2"], capsys)
    assert code == 0 and stdout.count("\n") == 3, err


@pytest.mark.parametrize("trainer", ["parallel", "draft", "feature"])
def test_trainers_check_out_before_the_model_loads(trainer, word, tmp_path, capsys, monkeypatch):
    """Hours of training must not end in a refused write: --out is checked before anything is loaded."""
    import decoding.runtime.models as models

    def load_(spec):
        raise AssertionError(f"the model was loaded ({spec.name}) before the bad --out was refused")

    monkeypatch.setattr(models, "load", load_)
    out = tmp_path / "nodir" / "w.safetensors"
    code, _, err = cli_main(["train", trainer, "--model", str(word), "--out", str(out)], capsys)
    line = one_line(err)
    assert code == 2 and line.startswith(f"error: out='{out}' is invalid: its directory "), line


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_gguf_conversion_leaves_no_temporary_directory(failure, tmp_path):
    """The converted copy of a GGUF model is written to a temporary directory renamed into place; a write
    that fails (a full disk: the load goes on without the cache) or is interrupted leaves nothing behind."""
    from types import SimpleNamespace

    from decoding.runtime import models

    def save(path):
        Path(path).mkdir()
        (Path(path) / "model.safetensors").write_bytes(b"half")
        raise failure

    model = SimpleNamespace(config=SimpleNamespace(), save_pretrained=save)
    target = tmp_path / "converted"
    if isinstance(failure, OSError):
        models._save_converted(model, SimpleNamespace(save_pretrained=save), target, tmp_path / "m.gguf")
    else:
        with pytest.raises(KeyboardInterrupt):
            models._save_converted(model, SimpleNamespace(save_pretrained=save), target, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []
