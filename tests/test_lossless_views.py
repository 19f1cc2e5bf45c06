"""ui/views/lossless.py: the verdict table, the two figures and the worked example, on a measurement of the
tiny llama and on hand-made outcomes (each verdict)."""
from __future__ import annotations

import dataclasses

import pytest

from decoding.core.measures import LosslessConfig
from decoding.lab.lossless import measure_lossless
from ui.views import lossless


@pytest.fixture(scope="module")
def result(tiny_lm):
    config = LosslessConfig(top_k=6, draft_top_k=6, lossy_threshold=0.05, samples=3000)
    return measure_lossless(tiny_lm, [3, 7, 11, 2], config)


@pytest.mark.slow
def test_rules_table_verdicts(result):
    table = lossless.rules_table(result).set_index("rule")
    assert list(table["claims_lossless"]) == [True, True, False, False]
    assert table.loc["speculative (ratio rule)", "verdict"].startswith("lossless")
    assert table.loc["DSpark (tree rule)", "verdict"].startswith("lossless")
    assert table.loc["retrospective plan", "verdict"].startswith("lossy: moves the distribution, and the samples")
    assert (table["samples"] == 3000).all()


def test_each_verdict_has_its_sentence(result):
    base = result.outcomes[0]
    cases = {(0.0, 0.5): "lossless", (0.1, 1e-9): "lossy: moves", (0.1, 0.5): "too few",
             (0.0, 1e-9): "1-in-1000"}
    for (distance, p_value), words in cases.items():
        changed = dataclasses.replace(result, outcomes=(dataclasses.replace(base, tv_distance=distance,
                                                                            p_value=p_value),))
        assert words in lossless.rules_table(changed).iloc[0]["verdict"]


def test_figures(result):
    exact = lossless.distribution_figure(result)
    assert [t.name.split(" (")[0] for t in exact.data] == ["p target", "q draft", "speculative", "DSpark",
                                                          "DSpark lossy mode", "retrospective plan"]
    assert list(exact.data[2].y) == pytest.approx(list(result.p_target))
    sampled = lossless.samples_figure(result)
    assert len(sampled.data) == 5 and "3000 seeded rounds" in sampled.layout.title.text
    assert sum(sampled.data[1].y) == pytest.approx(1)


def test_worked_example():
    table = lossless.worked_example().set_index("rule")
    assert table.loc["retrospective plan (two drafts, best ratio)", "P(A)"] == "17/20"
    assert table.loc["retrospective plan (two drafts, best ratio)", "tv_distance"] == "3/20"
    assert table.loc["speculative (ratio rule)", "tv_distance"] == "0"
    assert table.loc["DSpark lossy mode, threshold 0.2", "P(B)"] == "1"
    assert table.index[0] == "p target (plain sampling)"          # the chart legend's words, not a field name


def test_the_cut_off_is_stated_and_the_legend_agrees_with_the_verdict(result):
    """Issue 46: a legend said p = 0.021 while the verdict said "agree" and no cut-off was stated. Now both
    state the χ² test in the same words against the stated cut-off; a p-value just under it disagrees in both."""
    base = result.outcomes[0]
    for p_value, word in ((0.021, "agree"), (lossless.SIGNIFICANCE / 2, "disagree")):
        changed = dataclasses.replace(result, outcomes=(dataclasses.replace(base, tv_distance=0.0, p_value=p_value),))
        verdict = lossless.rules_table(changed).iloc[0]["verdict"]
        legend = lossless.samples_figure(changed).data[1].name
        said = lossless.test_words(p_value)
        assert said in verdict and said in legend and said.endswith(f": {word}")
        assert f"{lossless.SIGNIFICANCE:g}" in said
        assert ("disagree" in verdict) == (word == "disagree") or "fall outside" in verdict
    assert "cut-off (significance level) 0.001" in lossless.samples_figure(result).layout.title.text
