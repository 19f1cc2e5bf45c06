"""Five app sessions at once, each stepping another strategy on ONE model shared through the server's
model cache (ui/widgets/session.py): each gets exactly the trace the engine gives alone for its settings
(timings aside), and none sees another's state. AppTest instances are not thread-safe (run in threads they
intermittently lose each other's widgets), so the five sessions are interleaved Step by Step in one thread here; true
parallel threads on one shared model are tested at the engine level (tests/test_concurrency.py). Also:
Stop ends a long run and keeps its trace."""
from __future__ import annotations

import pytest
from app_support import new_app, ok, run_state, run_to_end
from dspark_helpers import APP_CHAIN

from decoding.core.trace import from_json, to_json, without_timings
from ui.widgets import keys, stepper

REPEAT = "one two three one two three one two three one two"


@pytest.fixture(scope="module")
def drafter_file(tiny_dir, tmp_path_factory):
    """Random parallel-drafter weights that fit the tiny app model (hidden 32, the real vocabulary)."""
    from dspark_helpers import random_drafter

    from decoding.runtime.models import ModelSpec, load

    path = tmp_path_factory.mktemp("drafter") / "tiny-drafter.safetensors"
    random_drafter(load(ModelSpec(name=str(tiny_dir), device="cpu")), gamma_max=4).save(path)
    return path


@pytest.fixture(scope="module")
def sessions(drafter_file) -> dict[str, dict]:
    """URL settings of five sessions: one per strategy, seeded, with different prompts and seeds."""
    return {
        "greedy": {"strategy": "greedy", "prompt": "Name a colour."},
        "sample": {"strategy": "sample", "temperature": "0.8", "top_k": "30", "seed": "4"},
        "beam": {"strategy": "beam", "num_beams": "3", "prompt": "Count to three."},
        "speculative": {"strategy": "speculative", "draft": "lookup", "gamma": "3", "temperature": "0", "seed": "2",
                        "prompt": REPEAT, "chat": "0"},
        "dspark": {**APP_CHAIN, "strategy": "dspark", "drafter": str(drafter_file), "gamma": "3", "temperature": "0.6",
                   "seed": "9", "prompt": REPEAT, "chat": "0"},
    }


def drive(query: dict):
    """One session: open the playground, Step once, then Run to end."""
    at = new_app({"max_new": "10", **query})
    ok(at)
    at.button(key="pg.step").click().run()
    ok(at)
    run_to_end(at)
    ok(at)
    return at


def finished(at) -> bool:
    return keys.RUN in at.session_state and run_state(at).done


def engine_alone(live) -> dict:
    """What the engine gives for the session's model, prompt and config, run on its own."""
    from decoding.runner import run

    trace = run(live.lm, live.prompt_ids, live.config, prompt_text=live.prompt_text, **live.strategy_kwargs)
    return without_timings(trace)


def session_of_forward(lm):
    """Record which app session each forward of the shared model serves (a hook; removed by the caller).
    The sessions are driven one rerun at a time, so it is the session whose rerun is under way, set in
    `current` before each rerun: the forwards themselves run on the engine thread the app enables
    (decoding/runtime/engine_thread.py), outside the session's script thread."""
    calls: list[str] = []
    current = ["?"]

    def hook(module, args):
        calls.append(current[0])

    return calls, current, lm.model.register_forward_pre_hook(hook)


@pytest.mark.slow
def test_five_sessions_at_once_share_the_model_and_nothing_else(tiny_dir, sessions):
    from ui.widgets.session import load_lm

    shared = load_lm(str(tiny_dir), "auto", "auto")       # the object the model cache hands every session
    calls, current, hook = session_of_forward(shared)
    apps = {}
    try:
        for name, query in sessions.items():                  # all five open before any runs
            current[0] = name
            apps[name] = new_app({"max_new": "10", **query})
            ok(apps[name])
        for _ in range(40):                                   # one Step per session in turn
            for name, at in apps.items():
                if not finished(at):
                    current[0] = name
                    at.button(key="pg.step").click().run()
                    ok(at)
            if all(finished(at) for at in apps.values()):
                break
    finally:
        hook.remove()
    assert sorted(apps) == sorted(sessions)
    lives = {name: run_state(at) for name, at in apps.items()}
    assert all(live.lm is shared for live in lives.values())          # one model object for all five
    assert set(calls) == set(sessions)
    switches = sum(a != b for a, b in zip(calls, calls[1:]))
    assert switches > 4, switches                                     # their forwards really interleaved
    assert len({id(live) for live in lives.values()}) == 5            # each session its own run
    traces = {}
    for name, live in lives.items():
        assert live.done and live.error is None, (name, live.error)
        assert live.config.strategy == name
        assert apps[name].session_state[keys.SETTINGS].strategy == name
        traces[name] = without_timings(live.trace())
        assert traces[name] == engine_alone(live), name
    assert len({tuple(t["output_ids"]) for t in traces.values()}) == 5   # five different runs
    assert any(e.accepted for e in lives["speculative"].events)          # lookup drafts were accepted
    assert any(e.nodes for e in lives["dspark"].events if not e.prefill)  # lattices were verified


@pytest.mark.slow
def test_a_session_alone_gives_the_same_trace(tiny_dir, sessions):
    """The threaded sessions are compared with the engine; here the same holds for a session driven
    on its own, so the comparison measures the app, not just the engine."""
    for name in ("sample", "dspark"):
        live = run_state(drive(sessions[name]))
        assert without_timings(live.trace()) == engine_alone(live), name


def test_stop_ends_a_long_run_and_the_trace_is_kept(tiny_dir, monkeypatch):
    """In the browser each chunk of a long run is its own fragment rerun, and a click on Stop is handled
    between two chunks. AppTest would follow all the chunks' reruns inside one run(); with the rerun
    request left out, each run() here is one chunk, so Stop can be clicked between chunks as in a browser."""
    monkeypatch.setattr(stepper, "CHUNK_S", 0.01)             # a step or two per chunk
    monkeypatch.setattr(stepper, "rerun_fragment", lambda: None)
    at = new_app({"max_new": "300", "strategy": "sample", "seed": "1"})
    at.button(key="pg.run_end").click().run()
    ok(at)
    assert keys.RUNNING in at.session_state
    first = len(run_state(at).events)
    at.run()                                                   # the next chunk
    assert len(run_state(at).events) > first and not at.button(key="pg.stop").disabled
    at.button(key="pg.stop").click().run()
    ok(at)
    live = run_state(at)
    recorded = len(live.events)
    assert keys.RUNNING not in at.session_state and at.button(key="pg.stop").disabled
    assert 2 <= recorded < 300 and not live.done
    assert any(f"{recorded} steps recorded (in progress)" in c.value for c in at.caption)
    at.run()                                                   # nothing runs on by itself after Stop
    assert len(run_state(at).events) == recorded
    trace = live.trace()
    assert trace.stop_reason == "stopped" and len(trace.steps) == recorded and trace.error is None
    assert without_timings(from_json(to_json(trace))) == without_timings(trace)
    at.switch_page("app_pages/traces.py").run()                # the stopped run can be downloaded
    ok(at)
    assert at.get("download_button")
    at.switch_page("app_pages/playground.py").run()
    at.button(key="pg.step").click().run()                     # and continues where it stopped
    ok(at)
    assert len(run_state(at).events) == recorded + 1
    assert run_state(at).events[:recorded] == live.events[:recorded]
