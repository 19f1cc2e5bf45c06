"""Every chart speaks the tables' words (issue 39): no legend entry, chart or axis title, colour-bar title,
annotation or hover text holds a trace's field name (p_target, q_draft, tau, verify_ms, top_k), nor does a
token chip's tooltip; the words come from ui/views/headers.py, as the tables' do. The pages are driven
through AppTest on recorded traces (tests/golden, no model); the Lab's measured and losslessness charts,
which need a model to fill, are built from hand-made measurements."""
from __future__ import annotations

import re

import plotly.graph_objects as go
import pytest
from page_support import app, chart_texts, golden, page_charts, report, results, rich_step  # noqa: F401  (app: fixture)

from decoding.core.measures import LosslessResult, RuleOutcome
from ui.views import lab, lossless
from ui.views.chips import chips_for
from ui.widgets import keys, strategy_panels  # noqa: F401  (strategy_panels registers the strategies' chips)

FIELD_NAME = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\btau\b")   # q_draft, verify_ms, c_k, tau
MARKUP = re.compile(r"%\{[^}]*\}|<[^>]*>")                              # %{y:.4f}, <br>, <extra>


def chart_problems(fig: dict) -> list[str]:
    """Each field name a chart shows its users, with where it shows it (once per place, with its first text)."""
    found: dict[tuple[str, str], str] = {}
    for where, text in chart_texts(fig):
        for name in FIELD_NAME.findall(MARKUP.sub(" ", text or "")):
            found.setdefault((where, name), text[:80])
    return [f"{where} {text!r}: {name}" for (where, name), text in found.items()]


@pytest.mark.slow
def test_every_chart_on_the_pages_speaks_to_users(app):  # noqa: F811
    seen: dict[str, list[str]] = {}
    at = app()
    at.switch_page("app_pages/traces.py")
    at.session_state[keys.REPLAY_VIEW] = "This step"
    for name in ("sample", "spec_lookup", "spec_feature_sampled", "dspark_tree_sampled", "dspark_lookup_cost"):
        trace = golden(name)
        at.session_state[keys.REPLAY] = trace
        at.run()                                                    # a new trace resets the step slider
        at.session_state[keys.REPLAY_CURSOR] = 2 if name == "sample" else rich_step(trace.steps)   # 2: top-p cut
        for i, fig in enumerate(page_charts(at.run())):
            seen[f"{name} chart {i}"] = chart_problems(fig)
    at.session_state["tr.ds_value"] = "q_draft"                  # the lattice coloured by the drafter's q
    for i, fig in enumerate(page_charts(at.run())):
        seen[f"lattice by q chart {i}"] = chart_problems(fig)
    at.session_state[keys.REPLAY] = golden("spec_lookup_sampled")  # the Lab reads the replayed trace
    at.session_state[keys.COMPARE] = {"1: greedy": golden("greedy"), "2: speculative": golden("spec_lookup"),
                                      "3: dspark": golden("dspark_chain"), "4: beam": golden("beam")}
    for name, page in (("lab", "app_pages/lab.py"), ("compare", "app_pages/compare.py")):
        for i, fig in enumerate(page_charts(at.switch_page(page).run())):
            seen[f"{name} chart {i}"] = chart_problems(fig)
    at.session_state[keys.WHATIF_SOURCE] = "Upload a trace"
    for name in ("spec_cost", "dspark_chain"):
        at.session_state[keys.WHATIF_TRACE] = golden(name)
        for i, fig in enumerate(page_charts(at.switch_page("app_pages/whatif.py").run())):
            seen[f"what-if {name} chart {i}"] = chart_problems(fig)
    assert len(seen) >= 30, "\n".join(seen)                             # the drive reached the charts
    problems = [f"{where}: {p}" for where, found in seen.items() for p in found]
    assert not problems, "\n".join(problems)


def test_every_chip_tooltip_speaks_to_users():
    """The output chips' tooltips (their hover) of every strategy's recorded trace."""
    names = ("greedy", "sample", "beam", "spec_feature_sampled", "spec_lookup", "dspark_tree_sampled",
             "dspark_lookup_cost")
    tips = {(name, c.tooltip) for name in names for c in chips_for(golden(name).steps)}
    assert {name for name, _ in tips} == set(names)
    assert not [tip for _, tip in tips if tip.startswith("no chip view")]
    problems = {f"{name}: {tip!r}: {found}" for name, tip in tips for found in FIELD_NAME.findall(tip)}
    assert not problems, "\n".join(sorted(problems))


def _lossless_result() -> LosslessResult:
    outcomes = tuple(RuleOutcome(rule, (0.7, 0.3), (70, 30), 0.0, 0.1, 1, 0.75)
                     for rule in ("speculative", "dspark", "lossy", "retrospective"))
    return LosslessResult((5, 9), ("a", "b"), (0.7, 0.3), (0.5, 0.5), (1,), outcomes)


def test_the_labs_measured_charts_speak_to_users():
    measured = report({1: 100.0, 2: 104.0, 4: 110.0, 9: 160.0}, {1: 100.0, 4: 130.0})
    figures = [lab.cost_figure(measured), lab.throughput_figure(results()),
               lossless.distribution_figure(_lossless_result()), lossless.samples_figure(_lossless_result())]
    assert {i: chart_problems(f.to_plotly_json()) for i, f in enumerate(figures)} == dict.fromkeys(range(4), [])


def test_the_check_catches_a_field_name_wherever_a_chart_shows_it():
    """Negative control: the names the charts showed before (issue 39), in each place the check reads."""
    fig = go.Figure(go.Bar(name="p_target (bar colour = verdict)", x=["a"], y=[1], customdata=["q_draft 0.5"],
                           hovertemplate="%{x}<br>%{customdata}<extra>top_k</extra>"))
    fig.add_heatmap(z=[[1]], colorbar={"title": {"text": "q_draft"}}, hovertemplate="%{z}")
    fig.update_layout(title="tau", xaxis_title="verify_ms", yaxis2={"title": "c_k"})
    fig.add_annotation(text="top_p = 0.9", x=0, y=0)
    found = " ".join(chart_problems(fig.to_plotly_json()))
    for name in ("p_target", "q_draft", "top_k", "tau", "verify_ms", "c_k", "top_p"):
        assert f": {name}" in found, (name, found)
    words = go.Figure(go.Bar(name="p target", x=["top-k"], y=[1], hovertemplate="%{x}<br>q draft %{y:.4f}"))
    words.update_layout(title="τ (tokens per verification)", xaxis_title="verify (ms)")
    assert chart_problems(words.to_plotly_json()) == []
    assert chart_problems({"data": [{"text": ["my_var"], "hovertemplate": "%{y}"}]}) == []   # text not shown on hover
