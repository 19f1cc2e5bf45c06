"""AppTest of what Compare and the Playground say about their results (issue 46): Compare's verdict line and
its drafting toggle, a result marked out of date when the settings change, lane pickers kept across pages,
a Playground run replaced by new settings with a note, preset prompts, a link that opens on its step,
force pickers that follow the step on view, and a round that accepts nothing saying why."""
from __future__ import annotations

import re

import pytest
from app_support import REPEAT, new_app, ok, run_state, run_to_end

from ui.views import verdict
from ui.views.presets import PRESETS
from ui.widgets import keys

SPEC = {"strategy": "speculative", "draft": "lookup", "gamma": "3", "max_new": "12", "prompt": REPEAT, "chat": "0"}


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def streams(at) -> str:
    return "".join(h.value for h in at.html if "data-step=" in h.value)


def compare_three(at):
    at.switch_page("app_pages/compare.py").run()
    at.number_input(key=keys.LANES).set_value(3).run()
    at.selectbox(key=keys.lane_strategy(1)).set_value("speculative").run()
    at.text_input(key="cmp1.param.speculative.draft").set_value("lookup").run()
    at.selectbox(key=keys.lane_strategy(2)).set_value("sample").run()
    at.button(key=keys.COMPARE_RUN).click().run()
    ok(at)
    return at


@pytest.mark.slow
def test_compare_leads_with_the_verdict_and_hides_the_drafting_until_asked(tiny_dir):
    at = compare_three(new_app({"prompt": REPEAT, "chat": "0", "max_new": "12"}))
    traces = at.session_state[keys.COMPARE]
    assert traces["2: speculative"].output_ids == traces["1: greedy"].output_ids
    shown = " ".join(texts(at.info) + texts(at.success))
    assert "2: speculative: token-identical to greedy (12 tokens)." in shown
    assert "3: sample: diverges from greedy at token " in shown      # the negative control: a lane that differs
    assert not at.warning                                            # the result is current
    assert any(c.value.startswith("Made with: ") for c in at.caption)
    rejected = any(d.verdict == "rejected" for r in traces["2: speculative"].steps for d in r.drafts)
    assert rejected                                                  # else the toggle below shows nothing new
    assert "ds-origin-rejected" not in streams(at)                        # emitted text only, by default
    at.toggle(key=keys.COMPARE_DRAFTING).set_value(True).run()
    assert "ds-origin-rejected" in streams(at)


@pytest.mark.slow
def test_a_comparison_is_marked_out_of_date_and_its_lanes_survive_another_page(tiny_dir):
    at = compare_three(new_app())
    at.number_input(key=keys.MAX_NEW).set_value(7).run()
    stale = texts(at.warning)
    assert len(stale) == 1 and "max new tokens 6 → 7" in stale[0] and "run again" in stale[0]
    at.switch_page("app_pages/playground.py").run()
    at.switch_page("app_pages/compare.py").run()
    ok(at)
    assert at.number_input(key=keys.LANES).value == 3
    assert [at.selectbox(key=keys.lane_strategy(i)).value for i in range(3)] == ["greedy", "speculative", "sample"]
    assert at.text_input(key="cmp1.param.speculative.draft").value == "lookup"
    assert "max new tokens 6 → 7" in texts(at.warning)[0]           # still marked, still shown
    at.number_input(key=keys.MAX_NEW).set_value(6).run()
    assert not at.warning                                            # the settings that made it again
    at.number_input(key=keys.LANES).set_value(2).run()
    assert "lane 3: sample removed" in texts(at.warning)[0]


def test_new_settings_say_what_happened_to_the_run(tiny_dir):
    at = new_app()
    at.button(key=keys.STEP).click().run()
    at.button(key=keys.STEP).click().run()
    at.number_input(key=keys.MAX_NEW).set_value(8).run()
    ok(at)
    note = " ".join(texts(at.info))
    assert "max new tokens 6 → 8" in note and "run of 2 step(s) was set aside" in note
    assert run_state(at).events == []
    assert any("Made with: strategy greedy · seed 0 · max new tokens 8" in c.value for c in at.caption)
    at.button(key=keys.STEP).click().run()                          # negative control: no change, no note
    assert not any("set aside" in i.value for i in at.info)


def test_a_preset_puts_its_prompt_in_the_sidebar(tiny_dir):
    at = new_app()
    at.button(key=f"{keys.PRESET}0").click().run()
    ok(at)
    assert at.session_state[keys.SETTINGS].prompt == PRESETS[0].prompt
    assert at.text_area(key=keys.PROMPT).value == PRESETS[0].prompt
    assert any(c.value.startswith("Copy a text: ") for c in at.caption)


def test_a_link_opens_on_its_step(tiny_dir):
    at = new_app({"step": "3"})
    ok(at)
    assert len(run_state(at).events) == 4 and at.session_state[keys.CURSOR] == 3
    assert any("Opened on step 3" in s.value for s in at.success)
    current = re.compile(r'class="[^"]*ds-current[^"]*"[^>]*data-step="(\d+)"')
    assert current.findall(streams(at)) == ["3"]
    assert at.query_params[keys.QP_STEP] == ["3"] or at.query_params[keys.QP_STEP] == "3"
    at.button(key=keys.BACK).click().run()
    assert at.query_params[keys.QP_STEP] in ("2", ["2"])             # the link follows the step on view
    plain = new_app()                                                # negative control: no step, no replay
    assert run_state(plain).events == [] and keys.QP_STEP not in plain.query_params


def test_a_link_step_out_of_range_is_named_and_ignored(tiny_dir):
    at = new_app({"step": "99"})
    ok(at)
    assert run_state(at).events == []
    assert any(e.value.startswith("step='99' from the link is not a step of this run") for e in at.error)


def test_force_pickers_follow_the_round_on_view(tiny_dir):
    at = new_app(SPEC)
    run_to_end(at)
    events = run_state(at).events
    assert at.selectbox(key="pg.force_pick").value == 0
    at.selectbox(key="pg.force_pick").set_value(2).run()
    assert at.selectbox(key="pg.force_pick").value == 2
    at.button(key=keys.BACK).click().run()
    ok(at)
    assert at.session_state[keys.CURSOR] == len(events) - 2
    assert at.selectbox(key="pg.force_pick").value == 0              # not the choice made at the other round


def test_a_round_that_accepts_nothing_says_why(tiny_dir):
    at = new_app(SPEC)
    run_to_end(at)
    events = run_state(at).events
    empty = next(i for i, e in enumerate(events) if verdict.nothing_accepted(e))
    at.session_state[keys.CURSOR] = empty
    at.run()
    ok(at)
    assert verdict.nothing_accepted(events[empty]) in texts(at.info)
    accepting = next(i for i, e in enumerate(events) if e.accepted)  # negative control
    at.session_state[keys.CURSOR] = accepting
    at.run()
    assert not any(i.startswith("Nothing accepted") for i in texts(at.info))


def test_whatif_says_which_run_it_reads(tiny_dir):
    at = new_app(SPEC)
    run_to_end(at)
    steps = len(run_state(at).events)
    at.switch_page("app_pages/whatif.py").run()
    ok(at)
    made = [c.value for c in at.caption if c.value.startswith("From the Playground run")]
    assert len(made) == 1 and f"({steps} steps)" in made[0]
    assert "strategy speculative: draft lookup, gamma 3 · seed 0 · max new tokens 12" in made[0]


def test_the_token_pickers_follow_the_step_on_view_too(tiny_dir):
    at = new_app()
    at.number_input(key=keys.N_STEPS).set_value(4)
    at.button(key=keys.RUN_N).click().run()
    at.selectbox(key="pg.force_pick").set_value(3).run()
    at.button(key=keys.FORWARD).click().run()                      # the same step: the choice stays
    assert at.selectbox(key="pg.force_pick").value == 3
    at.button(key=keys.BACK).click().run()
    ok(at)
    assert at.session_state[keys.CURSOR] == 2 and at.selectbox(key="pg.force_pick").value == 0
