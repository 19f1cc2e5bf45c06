"""One server shared by many sessions (docs/app.md, "On a shared server"): model copies are held in a bounded
least-recently-used cache that no link can pin, a draft goes with its target, a session's Lab results are
capped, and a run idle for a while lets go of its generator and model, then goes on exactly as before."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest
from app_support import new_app, ok, run_state
from md_helpers import shown

from decoding.core.config import GreedyConfig, SampleConfig
from decoding.core.trace import without_timings
from decoding.runner import run
from decoding.runtime.model_cache import ModelCache
from ui.widgets import engine, keys, lab_panels, live, session
from ui.widgets.live import LiveRun, release_idle
from ui.widgets.waiting import waiting_line

PROMPT = [1, 5, 9, 2]


class Weights:
    """Stands for a loaded model: only whether it is still alive matters."""


def alive(refs: list[weakref.ref], collect: bool = True) -> int:
    if collect:
        gc.collect()
    return sum(ref() is not None for ref in refs)


def test_the_cache_keeps_the_cap_most_recently_used_and_no_more():
    cache, refs = ModelCache(2), []

    def load():
        refs.append(weakref.ref(obj := Weights()))
        return obj

    for key in ("a", "b", "a", "c", "d", "e", "f"):
        cache.get(key, load)
        assert alive(refs, collect=False) <= 2 and len(cache.keys()) <= 2   # no cycles: freed at once
    assert cache.keys() == ["e", "f"] and len(refs) == 6           # "a" came from the cache once
    lru = ModelCache(2)
    for key in ("a", "b", "a", "c"):                               # "a" used after "b": "b" goes
        lru.get(key, Weights)
    assert lru.keys() == ["a", "c"]
    with pytest.raises(ValueError, match="cap=0"):
        ModelCache(0)


def test_peek_returns_what_is_held_and_never_loads():
    """The app's reruns read a held model with peek (no loader thread); peek counts as a use."""
    cache = ModelCache(2)
    assert cache.peek("a") is None and cache.keys() == []
    a = cache.get("a", Weights)
    cache.get("b", Weights)
    assert cache.peek("a") is a and cache.keys() == ["b", "a"]      # "a" is now the most recently used
    cache.get("c", Weights)
    assert cache.peek("b") is None and cache.keys() == ["a", "c"]


def test_a_failed_load_keeps_nothing_and_a_held_entry_survives_its_drop():
    cache = ModelCache(1)
    with pytest.raises(OSError):
        cache.get("bad", lambda: (_ for _ in ()).throw(OSError("no such model")))
    assert cache.keys() == [] and cache._loading == {}
    held = cache.get("a", Weights)
    cache.get("b", Weights)
    assert not cache.holds("a", held) and isinstance(held, Weights)   # the holder's reference still works


def test_callers_of_one_key_at_once_load_it_once():
    cache, loads, gate = ModelCache(2), [], threading.Barrier(4)

    def load():
        loads.append(1)
        return Weights()

    def caller(out: list):
        gate.wait()
        out.append(cache.get("k", load))

    out: list = []
    workers = [threading.Thread(target=caller, args=(out,)) for _ in range(4)]
    [w.start() for w in workers]
    [w.join() for w in workers]
    assert len(loads) == 1 and len({id(o) for o in out}) == 1 and cache._loading == {}


@pytest.fixture
def fresh_caches():
    session.TARGETS.drop()
    yield
    session.TARGETS.drop()
    session.DRAFTS.drop()


@pytest.mark.slow
def test_distinct_model_keys_never_hold_more_than_the_cap(tiny_dir, fresh_caches):
    """Real (tiny) models under three keys a link can ask for (device map and max memory, dtype): never more
    than TARGET_COPIES alive; the first, placed by accelerate, is freed once dropped."""
    refs = []
    for device, dtype, options in [("auto", "float32", {"device_map": "auto", "max_memory": "cpu=2GiB"}),
                                   ("cpu", "float32", {}), ("cpu", "bfloat16", {})]:
        refs.append(weakref.ref(session.load_lm(str(tiny_dir), device, dtype, **options)))
        assert len(session.TARGETS.keys()) <= session.TARGET_COPIES
    assert len(session.TARGETS.keys()) == session.TARGET_COPIES == 2
    assert alive(refs) == session.TARGET_COPIES and refs[0]() is None   # nothing else keeps a dropped model


def test_a_draft_goes_with_its_target(monkeypatch, fresh_caches):
    """A draft built on a target (the shallow draft shares its layers) must not keep a dropped target alive."""
    class Draft:
        def __init__(self, target):
            self.target = target

    monkeypatch.setattr(engine, "load", lambda spec: Weights())
    monkeypatch.setattr(engine, "load_draft", lambda name, target, **spec: Draft(target))
    key = ("m", "cpu", "float32")
    target = weakref.ref(session.load_lm_for(key))
    draft = weakref.ref(session.load_draft_lm("shallow", "cpu", "float32", key))
    assert draft().target is target()
    session.load_lm("m", "cpu", "bfloat16")
    session.load_lm("m", "cpu", "float16")                         # the first target is dropped
    assert session.DRAFTS.keys() == [] and alive([target, draft]) == 0


def step_holding(at) -> weakref.ref:
    """Click Step in `at`; a weak reference to the model its run holds now."""
    at.button(key="pg.step").click().run()
    ok(at)
    return weakref.ref(run_state(at).models()[0])


@pytest.mark.slow
def test_links_with_other_keys_cannot_pin_copies_and_runs_go_on(tiny_dir, fresh_caches):
    """Three tabs opened from links with three dtypes: the cache holds two copies, and the first tab's run
    lets go of its copy as soon as the cache drops it (the tab left open, idle). Once idle, the other runs
    let go too, and a Step in a released tab reloads its model and gives the trace the engine gives alone."""
    apps = [new_app({"dtype": dtype, "strategy": "sample", "seed": "3"}) for dtype in ("float32", "bfloat16",
                                                                                        "float16")]
    refs = [step_holding(at) for at in apps]
    assert len(session.TARGETS.keys()) == 2
    assert refs[0]() is None and not run_state(apps[0]).holds()     # freed at once: no collection needed
    assert release_idle(idle_s=0) == 2                              # the other two, idle, let go as well
    assert alive(refs) == session.TARGET_COPIES                     # their copies are the cache's
    first = apps[0]
    first.button(key="pg.step").click().run()
    ok(first)
    done = run_state(first)
    assert len(done.events) == 2 and str(done.lm.dtype) == "torch.float32"
    alone = run(done.lm, done.prompt_ids, done.config, prompt_text=done.prompt_text)
    assert without_timings(done.trace())["steps"] == without_timings(alone)["steps"][:2]


@pytest.mark.slow
def test_tabs_from_links_with_other_max_memory_never_hold_more_than_the_cap(tiny_dir, fresh_caches):
    """Issue 47, probe class 6: tabs opened from links that differ only in max_memory (bfloat16, placed by
    accelerate) each step once and stay (a closed tab's session is kept by Streamlit for two minutes, its
    run with it). On the code before the fix every tab's run kept its copy: four tabs, four copies. Now a
    run lets go of a copy the cache drops, so never more than TARGET_COPIES are alive."""
    apps, refs = [], []
    for gib in range(4):
        apps.append(new_app({"dtype": "bfloat16", "device_map": "auto", "max_memory": f"cpu={gib + 1}GiB"}))
        refs.append(step_holding(apps[-1]))
        assert alive(refs, collect=False) <= session.TARGET_COPIES, f"after tab {gib + 1}"
    assert alive(refs, collect=False) == session.TARGET_COPIES      # control: the cache's copies are counted
    assert [str(run_state(at).lm.dtype) for at in apps[-2:]] == ["torch.bfloat16"] * 2


@pytest.mark.slow
def test_a_run_stepping_at_the_drop_keeps_its_copy_until_its_step_ends(tiny_dir, fresh_caches):
    """The allowance: a run in the middle of a step when its copy is dropped keeps it (releasing it there
    would reload the model mid-step); the next page that asks for a model lets go of it."""
    first = new_app({"dtype": "bfloat16"})
    ref = step_holding(first)
    run = run_state(first)
    with run._stepping:                                             # as if another session's step were running
        for dtype in ("float32", "float16"):
            step_holding(new_app({"dtype": dtype}))
        assert ref() is not None and run.holds()                    # negative control: held through the drop
    second = new_app({"dtype": "float32"})                          # any page asking for a model
    ok(second)
    assert ref() is None and not run.holds()


def test_a_drop_hands_the_freed_heap_back(monkeypatch, fresh_caches):
    """Freed copies are handed back to the OS (glibc's malloc_trim; CUDA's cached blocks to the driver) whenever a
    cache drops one."""
    trims = []
    monkeypatch.setattr(session.heap, "give_back", lambda: trims.append("heap"))
    monkeypatch.setattr(engine, "free_device_memory", lambda: trims.append("cuda"))
    monkeypatch.setattr(engine, "load", lambda spec: Weights())
    session.load_lm("m", "cpu", "float32")
    session.load_lm("m", "cpu", "bfloat16")
    assert trims == []                                              # control: nothing dropped, nothing trimmed
    session.load_lm("m", "cpu", "float16")
    assert trims == ["heap", "cuda"]


def test_a_target_dropped_with_its_draft_is_handed_back_once(monkeypatch, fresh_caches):
    """The draft built on a dropped target goes with it, and the heap is handed back once for both."""
    trims = []
    monkeypatch.setattr(session.heap, "give_back", lambda: trims.append("heap"))
    monkeypatch.setattr(engine, "free_device_memory", lambda: None)
    monkeypatch.setattr(engine, "load", lambda spec: Weights())
    first = session.target_key("m", "cpu", "float32", {})
    session.load_lm("m", "cpu", "float32")
    session.DRAFTS.get(("draft", first), Weights)
    session.load_lm("m", "cpu", "bfloat16")
    session.load_lm("m", "cpu", "float16")                          # drops the first target and its draft
    assert session.DRAFTS.keys() == [] and trims == ["heap"]


def test_give_back_asks_glibc_on_linux():
    import platform
    import sys

    from decoding.runtime import heap

    assert heap.give_back() is (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")


def test_a_released_run_goes_on_exactly_as_if_it_had_not_been(tiny_lm):
    config = SampleConfig(max_new_tokens=8, temperature=1.1, seed=5)
    reloads = []
    kept = LiveRun(tiny_lm, PROMPT, config, reload=lambda: (reloads.append(1), (tiny_lm, {}))[1])
    kept.step(3)
    kept.release()
    assert not kept.holds() and kept._lm is None
    kept.run_to_end()
    assert reloads == [1]
    assert without_timings(kept.trace()) == without_timings(run(tiny_lm, PROMPT, config))


def test_release_idle_takes_only_runs_idle_long_enough(tiny_lm):
    busy = LiveRun(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=4))
    idle = LiveRun(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=4), reload=lambda: (tiny_lm, {}))
    busy.step(1)
    idle.step(1)
    idle.touched -= 100
    release_idle(idle_s=50)
    assert idle._gen is None and idle._lm is None
    assert busy._gen is not None and busy.holds()                 # a run in use keeps its generator
    busy.touched -= 100
    release_idle(idle_s=50)
    assert busy._gen is None and busy.lm is tiny_lm               # no reload given: the model stays


def test_runs_of_closed_sessions_leave_no_trace_in_the_registry(tiny_lm):
    gc.collect()
    before = live.live_runs()
    runs = [LiveRun(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=2)) for _ in range(3)]
    assert live.live_runs() == before + 3
    del runs
    gc.collect()
    assert live.live_runs() == before


def test_a_session_keeps_its_newest_lab_results():
    store: dict = {}
    for i in range(lab_panels.LAB_RESULTS + 5):
        lab_panels.keep_newest(store, i, [i])
    assert list(store) == list(range(5, 17))
    lab_panels.keep_newest(store, 5, ["again"])                   # measured again: the newest now
    lab_panels.keep_newest(store, 99, [99])                       # so 6 is the oldest and goes
    assert list(store) == [*range(7, 17), 5, 99] and store[5] == ["again"]


def test_a_step_that_waits_for_other_sessions_says_so(tiny_dir, monkeypatch):
    """While other sessions have work on the engine thread, the Step's spinner says how many."""
    from contextlib import nullcontext

    from decoding.runtime.engine_thread import ENGINE
    from ui.widgets import stepper

    shown = []
    monkeypatch.setattr(stepper.st, "spinner", lambda text, **kw: (shown.append(text), nullcontext())[1])
    at = new_app()
    monkeypatch.setattr(ENGINE, "others_ahead", lambda owner=None: 2)
    at.button(key="pg.step").click().run()
    ok(at)
    assert len(run_state(at).events) == 1
    assert [t for t in shown if t.startswith("Waiting")] == [waiting_line(2)]
    assert "2 other sessions" in waiting_line(2) and "1 other session on" in waiting_line(1)
    assert waiting_line(0) is None


class ShownWhileWaiting:
    """Stands in for st.spinner and st.progress (and the bar it returns): keeps every text they are given."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, *args, text: str = "", **kw):
        self.texts.append(shown(text or (args[0] if args and isinstance(args[0], str) else "")))
        return self

    progress = __call__

    def empty(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def click_run_compare(at):
    at.switch_page("app_pages/compare.py").run()
    at.button(key=keys.COMPARE_RUN).click().run()
    return lambda: at.session_state[keys.COMPARE]


def click_measure_lab(at):
    at.switch_page("app_pages/lab.py").run()
    at.text_input(key=keys.LAB_TOKENS).set_value("1")
    at.text_input(key=keys.LAB_BATCHES).set_value("1")
    at.number_input(key=keys.LAB_REPEATS).set_value(1)
    at.button(key=keys.LAB_COST_RUN).click().run()
    return lambda: at.session_state[keys.LAB]


def click_rerun_tour(at):
    at.switch_page("app_pages/tour.py").run()
    at.button(key=keys.TOUR_RUN).click().run()
    return lambda: at.session_state[keys.TOUR_LIVE]["greedy"]


@pytest.mark.parametrize("click", [click_run_compare, click_measure_lab, click_rerun_tour])
def test_other_pages_that_wait_for_other_sessions_say_so(tiny_dir, monkeypatch, click):
    """Compare's lanes, the Lab's measurements and the Tour's live runs wait on the engine thread as the
    Playground's steps do, and say the same line while other sessions have work there."""
    import streamlit

    from decoding.runtime.engine_thread import ENGINE

    bars = ShownWhileWaiting()
    monkeypatch.setattr(streamlit, "spinner", bars)
    monkeypatch.setattr(streamlit, "progress", bars)
    at = new_app({"max_new": "3", "stop": "greedy"})
    monkeypatch.setattr(ENGINE, "others_ahead", lambda owner=None: 2)
    result = click(at)
    ok(at)
    assert result()                                               # the work was done
    waited = [t for t in bars.texts if waiting_line(2) in t]
    assert waited and all(t.endswith(f" — {waiting_line(2)}") for t in waited), bars.texts


def test_a_model_keeps_one_trained_drafter_of_a_kind(tmp_path):
    """Links naming many drafter files cannot pile drafters up on the model: the last one named is kept."""
    from dspark_helpers import random_drafter, varied_llama

    from decoding.drafters.factory import load_lattice_drafter

    lm = varied_llama(seed=0)
    paths = []
    for seed in (0, 1):
        paths.append(tmp_path / f"drafter{seed}.safetensors")
        random_drafter(lm, gamma_max=4, seed=seed).save(paths[-1])
    first = load_lattice_drafter(lm, str(paths[0]))
    assert load_lattice_drafter(lm, str(paths[0])) is first          # loaded once while it is the one named
    gone = weakref.ref(first)
    del first
    second = load_lattice_drafter(lm, str(paths[1]))
    assert alive([gone]) == 0 and [k for k in lm._loaded if k[0] == "dspark drafter"] == [("dspark drafter",
                                                                                            "parallel")]
    assert load_lattice_drafter(lm, str(paths[1])) is second


def test_a_model_keeps_one_draft_model_source(monkeypatch):
    """DSpark's model:ID sources: a second name replaces the first on the target, not beside it."""
    from dspark_helpers import varied_llama

    from decoding.drafters import factory

    target = varied_llama(seed=0)
    monkeypatch.setattr(factory, "load_draft", lambda name, target: Weights())
    monkeypatch.setattr(factory, "DraftModelDrafter", lambda draft, target: draft)
    monkeypatch.setattr(factory, "DraftModelSource", lambda drafter: drafter)
    first = weakref.ref(factory.draft_model_source(target, "a"))
    assert factory.draft_model_source(target, "a") is first()       # loaded once while it is the one named
    second = factory.draft_model_source(target, "b")
    assert alive([first]) == 0 and factory.draft_model_source(target, "b") is second
    assert [k for k in target._loaded if k[0] == "draft model source"] == [("draft model source",)]


def test_a_run_that_cannot_reload_keeps_its_generator_when_copies_are_dropped(tiny_lm, fresh_caches):
    """A run given no `reload` would keep its model anyway: letting go of dropped copies leaves its generator
    (no replay for nothing); a run that can reload lets go (control)."""
    kept = LiveRun(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=4))
    reloads = LiveRun(tiny_lm, PROMPT, GreedyConfig(max_new_tokens=4), reload=lambda: (tiny_lm, {}))
    kept.step(1)
    reloads.step(1)
    assert session.let_go_of_dropped() >= 1
    assert kept._gen is not None and kept.models() == []
    assert not reloads.holds() and reloads.models() == []
