"""One glossary, used everywhere (issue 46): every column header, axis title and colour-bar title that a page
shows for each strategy's recorded trace is a glossary name (ui/views/glossary.py), or a header of
ui/views/headers.py, alone or with a unit in parentheses; the quantities a lecture needs each have one
definition; at temperature 0 the acceptance column shows the rule's 1 or 0. Pages are driven through AppTest on
recorded traces (tests/golden, no model)."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import plotly.graph_objects as go
import pytest
from page_support import app, chart_texts, golden, page_charts, rich_step  # noqa: F401  (app: fixture)

from ui.views import beam, dspark, glossary, headers, spec, tables
from ui.widgets import keys

PLAIN = frozenset(headers.HEADERS.values()) | frozenset(
    w for words in (beam.HEADERS, tables.METRICS_HEADERS, spec.GAMMA_CHOICE_HEADERS, dspark.SIZE_HEADERS)
    for w in words.values())
LABELLED = ("title",)        # chart texts that name one quantity: axis and colour-bar titles
TRACES = ("greedy", "sample", "beam", "spec_lookup", "spec_feature_sampled", "spec_cost", "dspark_chain",
          "dspark_tree_sampled", "dspark_lookup_cost")


def metric_labels(at) -> list[str]:
    return [m.label for m in at.metric]


def table_labels(at) -> list[str]:
    return [str(c) for element in at.dataframe for c in element.value.columns]


def chart_labels(at) -> list[str]:
    return [text for fig in page_charts(at) for where, text in chart_texts(fig)
            if text and (where.startswith(("xaxis", "yaxis")) or where == "colour bar")]


def label_problems(labels) -> list[str]:
    return sorted({label for label in labels if not glossary.is_term(label, PLAIN)
                   and not glossary.is_term(label.lower(), PLAIN)})


@pytest.mark.slow
def test_every_label_on_every_strategys_views_is_from_the_glossary(app):  # noqa: F811
    seen: dict[str, list[str]] = {}
    at = app()
    at.switch_page("app_pages/traces.py")
    at.session_state[keys.REPLAY_VIEW] = "This step"
    for name in TRACES:
        trace = golden(name)
        at.session_state[keys.REPLAY] = trace
        at.run()
        at.session_state[keys.REPLAY_CURSOR] = rich_step(trace.steps)
        at.run()
        seen[name] = table_labels(at) + chart_labels(at) + metric_labels(at)
    at.session_state[keys.WHATIF_SOURCE] = "Upload a trace"
    for name in ("spec_cost", "dspark_chain"):
        at.session_state[keys.WHATIF_TRACE] = golden(name)
        at.switch_page("app_pages/whatif.py").run()
        seen[f"what-if {name}"] = table_labels(at) + chart_labels(at)
    at.session_state[keys.REPLAY] = golden("spec_lookup_sampled")
    at.switch_page("app_pages/lab.py").run()
    seen["lab"] = table_labels(at) + chart_labels(at)
    assert all(seen.values()) and sum(map(len, seen.values())) > 100, [k for k, v in seen.items() if not v]
    problems = {where: label_problems(labels) for where, labels in seen.items() if label_problems(labels)}
    assert not problems, "; ".join(sorted({label for found in problems.values() for label in found}))


def test_the_check_catches_a_label_not_in_the_glossary():
    """Negative control: an ad-hoc header, a field name and an axis title in other words are caught; the
    glossary's names, with a unit, pass."""
    assert label_problems(["accept prob", "p_target", "p target", "τ (tokens per verification)",
                           "acceptance probability", "draft position k", "measured (ms)"]) == \
        ["accept prob", "p_target"]
    fig = go.Figure(go.Bar(x=[1], y=[1])).update_layout(xaxis_title="drafts per go", yaxis_title="probability")
    texts = [t for w, t in chart_texts(json.loads(fig.to_json())) if w.startswith(("xaxis", "yaxis"))]
    assert label_problems(texts) == ["drafts per go"]


def test_the_lectures_quantities_each_have_one_definition():
    for name in ("acceptance probability", "ŝ", "q draft", "p target", "Σmin(p,q)", "τ (tokens per verification)",
                 "acceptance rate", "expected accepted", "speed vs greedy (×)"):
        assert glossary.definition(name), name
    assert glossary.definition("p target (plain sampling)") == glossary.definition("p target")
    names = [t.name for t in glossary.TERMS]
    assert len(names) == len(set(names))
    assert sorted(t.name for t in glossary.sorted_terms()) == sorted(names)


def test_temperature_0_acceptance_is_the_rules_1_or_0():
    event = next(e for e in golden("spec_lookup").steps if e.kind == "spec_round" and e.accepted < e.gamma)
    table = spec.drafts_table(event)
    assert spec.greedy_round(event)
    judged = table[table["verdict"].isin(["accepted", "rejected"])]
    assert judged["accept_prob"].tolist() == [1.0 if v == "accepted" else 0.0 for v in judged["verdict"]]
    assert table["sum_min"].isna().all() and table["k"].tolist()[0] == 1
    sampled = next(e for e in golden("spec_feature_sampled").steps if e.kind == "spec_round")
    rows = spec.drafts_table(sampled).dropna(subset=["accept_prob"])
    assert rows["accept_prob"].tolist() == pytest.approx([min(1.0, d.ratio) for d in sampled.drafts
                                                          if d.verdict in ("accepted", "rejected")])
    assert pd.notna(spec.drafts_table(sampled)["sum_min"]).all()


def test_the_round_table_dspark_stage_2_and_what_if_agree_at_temperature_0():
    """One meaning of "acceptance probability" at temperature 0: the speculative round's column (the Tour's
    stops show the same table), DSpark's stage-2 column and What-if's aᵢ are the rule's 1 or 0."""
    from ui.views import whatif

    old_column_differs = False          # negative control: the engine's Σmin(p,q), shown there before
    for event in (e for e in golden("spec_lookup").steps if e.kind == "spec_round"):
        table = spec.drafts_table(event)
        judged = table["verdict"].isin(["accepted", "rejected"])
        a_i = whatif.round_accept_probs(event)
        assert table.loc[judged, "accept_prob"].tolist() == [a_i[i] for i in table.index[judged]]
        old_column_differs |= any(event.drafts[i].accept_prob != a_i[i] for i in table.index[judged])
    assert old_column_differs
    for event in (e for e in golden("dspark_chain").steps if e.kind == "dspark_round" and not e.prefill):
        verdicts = dspark.verdicts_table(event)
        judged = verdicts[verdicts["verdict"].isin(["accepted", "rejected"])]
        assert judged["p_accept"].tolist() == [float(v == "accepted") for v in judged["verdict"]]
    assert headers.header("p_accept") == headers.header("accept_prob") == "acceptance probability"


def test_the_smaller_items_speak_in_words():
    """Issue 46 item 9: no "-0" entropy, stop reasons, drafter and cost-table names and the speculative
    sources line in words; the forced legend only where a token was forced."""
    from types import SimpleNamespace

    from ui.views import chips, sources

    assert f"{tables.nats(-1e-9):.3g}" == "0" and f"{-0.0:.3g}" == "-0"            # negative control: -0
    assert tables.nats(0.25) == 0.25
    assert headers.value_word("stop_reason", "max_new_tokens") == "token budget reached"
    assert "max_new_tokens" not in headers.shown(pd.DataFrame({"stop_reason": ["max_new_tokens"]})).iloc[0, 0]
    assert sources.drafter_words("default[feature]") == "feature head (over default)"
    assert sources.drafter_words("lookup") == "lookup"
    assert tables.table_name("auto: default-cpu-float32.json") == "auto, profiled on this machine"
    info = SimpleNamespace(sources=("lookup",), reason="why")
    assert sources.drafting_text(info, speculative=True).startswith("Draft sources: prompt lookup")
    assert sources.drafting_text(info).startswith("Lattice sources: prompt lookup")
    plain = chips.chips_for(golden("greedy").steps)
    assert "forced" not in chips.origins_present(plain)
    forced = [dataclasses.replace(plain[0], origin="forced"), *plain[1:]]
    assert "forced" in chips.origins_present(forced)


def test_the_sidebar_glossary_lists_every_term_when_open(app):  # noqa: F811
    at = app()
    at.switch_page("app_pages/traces.py").run()
    texts = lambda: [m.value for m in at.sidebar.markdown]  # noqa: E731
    assert not any("acceptance probability" in t for t in texts())          # closed: nothing drawn
    at.session_state["ds.glossary_open"] = True
    at.run()
    shown = texts()
    assert len([t for t in shown if "**:" in t]) == len(glossary.TERMS)
    assert any("Σmin" in t and "before the draft is drawn" in t for t in shown)


# ---------------------------------------------------------------- counting (issue 46: 1-based everywhere)

COUNTED_FROM_1 = ("rank", "raw rank", "from beam", "k (draft position)", "candidate", "best next candidate",
                  "depth", "node", "position", "position in the text")
COUNTED_FROM_ROOT = ("parent",)       # 0 is the root of a plan (the last emitted token), then nodes / candidates


def counting_problems(frame: pd.DataFrame) -> list[str]:
    """The shown columns that say where something is and hold a number below 1 (0 for a plan's parent)."""
    out = []
    for column in frame.columns:
        lowest = 1 if column in COUNTED_FROM_1 else 0 if column in COUNTED_FROM_ROOT else None
        values = pd.to_numeric(frame[column], errors="coerce").dropna() if lowest is not None else ()
        if len(values) and values.min() < lowest:
            out.append(f"{column} from {values.min()}")
    return out


def test_the_counting_check_catches_a_0_based_column():
    """Negative control: a rank and a beam counted from 0 are caught; a parent 0 (the root) and "—" are not."""
    frame = pd.DataFrame({"rank": [0, 1], "from beam": [0, 1], "parent": [0, 2], "candidate": [1, None]})
    assert counting_problems(frame) == ["rank from 0", "from beam from 0"]


@pytest.mark.slow
def test_every_index_a_page_shows_counts_from_1(app):  # noqa: F811
    """Issue 46: ranks, beams, k, candidates, depths, nodes and positions are 1-based in every table the step views
    and the steps table show (the trace keeps its 0-based indices); a beam's "from beam" and DSpark's candidates
    were 0-based beside 1-based k in the charts."""
    at = app()
    at.switch_page("app_pages/traces.py")
    seen = {}
    for name in ("greedy", "beam", "spec_lookup", "dspark_chain", "dspark_tree_sampled"):
        trace = golden(name)
        at.session_state[keys.REPLAY] = trace
        at.session_state[keys.REPLAY_VIEW] = "This step"
        at.session_state["tr.cands_open"] = True           # the candidates table (drawn only while open)
        at.run()
        at.session_state[keys.REPLAY_CURSOR] = rich_step(trace.steps)
        at.run()
        seen[name] = [p for frame in at.dataframe for p in counting_problems(frame.value)]
        columns = {str(c) for frame in at.dataframe for c in frame.value.columns}
        at.session_state[keys.REPLAY_VIEW] = "All steps"
        at.run()
        seen[f"{name} steps"] = [p for frame in at.dataframe for p in counting_problems(frame.value)]
        seen[f"{name} checked"] = [] if columns & set(COUNTED_FROM_1) else ["no counted column shown"]
    assert not any(seen.values()), {k: v for k, v in seen.items() if v}


def test_charts_and_force_pickers_count_from_1():
    from ui.widgets import forcing

    step = golden("greedy").steps[0]
    assert [x.split(":")[0] for x in figures_x(step)][:2] == ["1", "2"]          # bars named by rank, as the table
    assert forcing.token_label(step, 0).startswith("rank 1:")
    beam_step = golden("beam").steps[1]
    labels = [forcing.beam_label(beam_step, r) for r in forcing.beam_ranks(beam_step)]
    assert labels[0].startswith("rank 1:") and any("from beam 1 " in s for s in labels)
    assert not any("from beam 0" in s or "rank 0" in s for s in labels)
    event = next(e for e in golden("dspark_chain").steps if e.kind == "dspark_round" and not e.prefill)
    fig = dspark.lattice_figure(event)
    assert min(fig.data[0].y) == 1 and "1 = drafter's top" in fig.layout.yaxis.title.text
    tags = [t for c in forcing.dspark_choices(event, 1) for t in c.tags]
    assert "candidate 1" in " ".join(tags) and "candidate 0" not in " ".join(tags)
    assert forcing.spec_position_label(next(e for e in golden("spec_lookup").steps if e.kind == "spec_round"),
                                       0).startswith("k=1:")
    assert glossary.counted_from_1(0) == 1 and glossary.counted_from_1(None) is None
    assert "counts from 1" in glossary.definition("counting")


def figures_x(step) -> list[str]:
    from ui.views import figures

    return list(figures.probability_bars(step).data[0].x)


RAW_IN_PICKERS = ("p_target", "q_draft", "not_reached", "residual p", "raw p", "cand ", "_token")


def picker_label_problems(label: str, limit: int) -> list[str]:
    """A force picker's option label that would be cut in its select box at 1280 px (longer than `limit`
    characters: tests/test_browser_layout.py measures the boxes) or that shows a trace's raw name."""
    out = [f"{label!r}: {len(label)} characters" for _ in range(1) if len(label) > limit]
    return out + [f"{label!r}: {raw!r}" for raw in RAW_IN_PICKERS if raw in label]


def all_picker_labels() -> list[tuple[str, int]]:
    """(label, the most characters its box shows) of every force picker's options on the golden traces."""
    from ui.widgets import forcing as f

    labels = []
    for name in ("greedy", "sample", "beam", "spec_lookup", "spec_lookup_sampled", "spec_feature_sampled",
                 "dspark_chain", "dspark_tree_sampled", "dspark_lookup_cost"):
        for e in golden(name).steps:
            if e.kind == "token":
                labels += [(f.token_label(e, i), f.WIDE_CHARS) for i in range(len(e.raw_top))]
            elif e.kind == "beam":
                labels += [(f.beam_label(e, r), f.WIDE_CHARS) for r in f.beam_ranks(e)]
            elif e.kind == "spec_round":
                for k in f.spec_positions(e):
                    labels += [(f.spec_position_label(e, k), f.PLACE_CHARS)]
                    labels += [(c.label(), f.LABEL_CHARS) for c in f.spec_choices(e, k)]
            elif e.kind == "dspark_round":
                for d in f.dspark_depths(e):
                    labels += [(f.dspark_depth_label(e, d), f.PLACE_CHARS)]
                    labels += [(c.label(), f.LABEL_CHARS) for c in f.dspark_choices(e, d)]
    return labels


def test_force_picker_labels_fit_and_use_glossary_words():
    """Issue 46: every option of the Playground's force pickers fits its box at 1280 px (forcing.LABEL_CHARS,
    PLACE_CHARS and WIDE_CHARS, from the boxes' widths) and names numbers in the glossary's words."""
    from ui.widgets import forcing

    labels = all_picker_labels()
    assert len(labels) > 200
    problems = [p for label, limit in labels for p in picker_label_problems(label, limit)]
    assert not problems, problems[:10]
    # negative control: the labels before (a DSpark candidate with its whole note; raw p) are caught
    old = "'<jupyter_start>' (id 11) — lattice cand 0, q draft 1, verified: p target 0.5, accepted"
    assert len(picker_label_problems(old, forcing.LABEL_CHARS)) == 2
    assert picker_label_problems("0: ' the' (id 279, raw p 0.41)", 80) == \
        ["\"0: ' the' (id 279, raw p 0.41)\": 'raw p'"]


def test_the_steps_line_shows_how_steps_are_numbered():
    """Steps count from 0 (the glossary's "counting"); the Playground's line shows the range, so "viewing step
    13" at the end of 14 steps reads as the last one, not the 13th."""
    assert glossary.steps_recorded(14, True, 13) == \
        "14 steps recorded (finished), numbered 0–13; viewing step 13"
    assert glossary.steps_recorded(1, False, 0) == "1 step recorded (in progress), step 0; viewing step 0"
    assert glossary.steps_recorded(0, False, -1) == "No step recorded yet (in progress)"
    assert glossary.steps_recorded(3, False, 7).endswith("viewing step —")      # a cursor past the run
