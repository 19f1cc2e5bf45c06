"""Property-based tests of the command line: generated `python -m decoding run|compare` argument lists
(every strategy flag, good and hostile values, flags that do not apply) on a small word model either run
(exit 0, the text printed, a trace written with --out that loads back) or are refused with `error:`
lines and exit 2 — never a traceback or another status. Seeded (derandomize) and bounded."""
from __future__ import annotations

import pytest
from dspark_helpers import random_drafter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from word_models import PROMPT, build_word_model_dir

from decoding import __main__ as cli
from decoding.core.trace import from_json
from decoding.runtime.models import ModelSpec, load

pytestmark = pytest.mark.slow   # fuzz tests: `make test-fast` leaves them out

STRATEGY_NAMES = ["greedy", "sample", "beam", "speculative", "dspark"]
NUMBERS = ["0", "1", "2", "3", "-1", "0.5", "1.5", "nan", "inf", "-inf", "1e999", "99999999999999999999", "abc", ""]
FLAGS = {
    "--temperature": NUMBERS, "--top-k": NUMBERS, "--top-p": NUMBERS, "--min-p": NUMBERS, "--seed": NUMBERS,
    "--top-n": NUMBERS, "--num-beams": NUMBERS, "--length-penalty": NUMBERS, "--gamma": NUMBERS,
    "--gamma-max": NUMBERS, "--lookup-max-ngram": NUMBERS, "--top-k-candidates": NUMBERS, "--budget": NUMBERS,
    "--confidence-threshold": NUMBERS, "--lossy-threshold": NUMBERS, "--max-new-tokens": ["1", "3", "0", "-2", "x"],
    "--gamma-policy": ["fixed", "heuristic", "confidence", "cost", "nope"], "--select": ["chain", "tree", "x"],
    "--draft": ["lookup", "lookup+", "shallow", "feature:/nonexistent", "lookup+/nonexistent", ""],
    "--cost-table": ["auto", "/nonexistent.json", "{cost}"], "--drafter": ["{drafter}", "/nonexistent"],
    "--max-memory": ["cpu=1GiB", "cpu=1e999GiB", "lots"], "--device-map": ["auto", "x"],
    "--prompt": ["", " ", "é\x00", PROMPT * 20], "--out": ["{out}", "{missing}/t.json", "{tmp}"],
}
SWITCHES = ["--early-stopping", "--no-chat-template"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz_cli")
    model = build_word_model_dir(tmp / "word")
    random_drafter(load(ModelSpec(str(model))), gamma_max=4).save(tmp / "drafter.safetensors")
    (tmp / "cost.json").write_text('{"version": 1, "verify_ms": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,'
                                   ' 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33]}')
    return {"model": str(model), "drafter": str(tmp / "drafter.safetensors"), "cost": str(tmp / "cost.json"),
            "out": str(tmp / "out.json"), "missing": str(tmp / "missing"), "tmp": str(tmp)}


ARGS = st.tuples(st.sampled_from(["run", "compare"]), st.lists(st.sampled_from(STRATEGY_NAMES), min_size=1, max_size=3),
                 st.dictionaries(st.sampled_from(sorted(FLAGS)), st.integers(0, 30), max_size=5),
                 st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))


def argv_of(example, files) -> list[str]:
    command, strategies, flags, switches = example
    argv = [command, "--model", files["model"], "--prompt", PROMPT, "--max-new-tokens", "3"]
    argv += ["--strategy", strategies[0]] if command == "run" else ["--strategy", *strategies]
    for flag, pick in flags.items():
        argv += [flag, FLAGS[flag][pick % len(FLAGS[flag])].format(**files)]
    return argv + switches


@settings(max_examples=120, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ARGS)
def test_any_command_line_runs_or_is_refused_in_lines(files, capsys, example):
    argv = argv_of(example, files)
    try:
        code = cli.main(argv)
    except SystemExit as exc:                      # argparse's own refusals exit through the parser
        code = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Traceback" not in out.out, argv
    assert code in (0, 2), (code, argv, out.err)
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    if code == 2:
        assert errors, (argv, out.err)
        return
    assert not errors and out.out.strip(), (argv, out.err)
    if "--out" in argv and argv[argv.index("--out") + 1] == files["out"]:
        text = open(files["out"], "rb").read()
        traces = [from_json(text)] if argv[0] == "run" else None
        assert traces is None or traces[0].output_ids is not None


def test_the_property_sees_both_outcomes(files, capsys):
    """Negative control: one generated shape of each outcome reaches its branch."""
    assert cli.main(["run", "--model", files["model"], "--prompt", PROMPT, "--max-new-tokens", "2"]) == 0
    assert cli.main(["run", "--model", files["model"], "--prompt", PROMPT, "--top-k", "-1",
                     "--strategy", "sample"]) == 2
    assert capsys.readouterr().err.startswith("error: top_k=-1 is invalid")


def test_a_speculative_run_that_drafted_nothing_prints_its_summary(files, capsys):
    """Found by the property above: prompt lookup with no match drafts nothing, so the acceptance rate is
    None; the summary printed `acceptance {None:.2f}` and the run died with a TypeError after its text."""
    assert cli.main(["run", "--model", files["model"], "--prompt", PROMPT, "--max-new-tokens", "3",
                     "--strategy", "speculative", "--draft", "lookup"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("[speculative] 3 tokens") and "tau 1.00" in summary and "acceptance" not in summary
