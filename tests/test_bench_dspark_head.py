"""bench/dspark_head.py's report: the table and the goal's arithmetic from synthetic measurements."""
from __future__ import annotations

import argparse

import pytest

from bench import dspark_head


def _row(speed, tau, rounds, ms, verify, draft):
    return {"speed": speed, "tau": tau, "rounds": rounds, "ms": ms, "verify": verify, "draft": draft}


def test_table_and_needed_tau():
    rows = {"greedy (ours)": _row([1.0, 1.0], [], 100, 10_000.0, 10_000.0, 0.0),
            dspark_head.DEFAULTS: _row([1.3, 1.5], [2.8, 3.0], 10, 2_000.0, 1_700.0, 300.0)}
    lines = dspark_head.render_set("fresh", rows, argparse.Namespace(temperature=0.0))
    assert f"| {dspark_head.DEFAULTS} | 1.400 [1.300–1.500] | 2.900 [2.800–3.000] | " \
           "200.0 | 170.0 | 30.0 |" in lines
    # a round costs 200 ms against 100 ms per greedy token: parity at τ = 2, 1.5× at τ = 3
    assert any("parity needs τ ≥ 2.00 and 1.5× needs τ ≥ 3.00; the runs' median τ is 2.90" in ln for ln in lines)


def test_budgets_add_contenders_and_bad_ones_name_the_flag(capsys):
    runs, reference = dspark_head.contenders(None, None, 0.0, 8, dspark_head.budget_list("5,6"))
    assert reference == "greedy (ours)"
    assert [n for n in runs if "tree ≤" in n and "defaults," in n] == ["DSpark defaults, tree ≤ 5",
                                                                       "DSpark defaults, tree ≤ 6"]
    assert not [n for n in dspark_head.contenders(None, None, 0.0, 8)[0] if "defaults, tree ≤" in n]
    for bad in ("5,x", "0", "5,999"):
        with pytest.raises(SystemExit):
            dspark_head.main(["--budgets", bad])
        err = capsys.readouterr().err
        assert "--budgets" in err and f"'{bad}'" in err


def test_report_writes_one_section_with_its_heading_and_tables(tmp_path, capsys):
    from types import SimpleNamespace

    import torch

    lm = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"), fast=None)
    args = argparse.Namespace(temperature=0.8, md=str(tmp_path / "out.md"))
    rows = {"sample (ours)": _row([1.0], [], 10, 400.0, 400.0, 0.0),
            dspark_head.DEFAULTS: _row([1.2], [2.0], 5, 300.0, 250.0, 50.0)}
    dspark_head.report(args, lm, {"fresh prompts": rows}, ("A title", "python -m bench x", "How. "), "x")
    text = (tmp_path / "out.md").read_text(encoding="utf-8")
    assert text.startswith("## A title\n\nCommand: `python -m bench x`")
    assert "How. Sampled with seed 0" in text and "### fresh prompts, temperature 0.8" in text
    assert f"| {dspark_head.DEFAULTS} | 1.200 [1.200–1.200] |" in text and text.strip() in capsys.readouterr().out
