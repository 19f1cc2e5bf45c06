"""Many runs on ONE shared model at once: every strategy, interleaved step by step in one thread and
run in parallel threads, gives exactly the trace it gives alone (timings aside); the model's lock is
held for each forward call and never across a generator's yield; a stopped run keeps its trace.
The app-level version (five AppTest sessions at once) is in test_app_concurrency.py."""
from __future__ import annotations

import random
import threading

import pytest
import torch
from dspark_helpers import one_thread, random_drafter, varied_llama
from lane_configs import CONFIGS, PROMPT, kwargs_for

from decoding import runner
from decoding.core.trace import from_json, to_json, without_timings

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

class CheckedLock:
    """An RLock that knows which thread holds it, to check where the engine takes the model's lock."""

    def __init__(self):
        self._lock = threading.RLock()
        self.owner: int | None = None
        self.depth = 0

    def __enter__(self):
        self._lock.acquire()
        self.owner, self.depth = threading.get_ident(), self.depth + 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.owner = None
        self._lock.release()

    def held_here(self) -> bool:
        return self.owner == threading.get_ident()


@pytest.fixture(scope="module")
def shared():
    """One model object for every run, with a checked lock and a hook that records unlocked forwards."""
    lm = varied_llama(seed=0)
    lm.lock = CheckedLock()
    unlocked: list[str] = []
    lm.model.register_forward_pre_hook(lambda module, args: None if lm.lock.held_here()
                                       else unlocked.append(threading.current_thread().name))
    drafter = random_drafter(lm, gamma_max=8)
    return lm, drafter, unlocked


@pytest.fixture(scope="module")
def alone(shared):
    lm, drafter, _ = shared
    return {name: without_timings(runner.run(lm, PROMPT, cfg, **kwargs_for(name, drafter)))
            for name, cfg in CONFIGS.items()}


def test_the_runs_differ_from_each_other(alone):
    """Five distinct traces (so a run that picked up another's state would show)."""
    outputs = {name: tuple(t["output_ids"]) for name, t in alone.items()}
    assert len(set(outputs.values())) == len(outputs), outputs
    assert all(len(t["steps"]) >= 2 for t in alone.values())


def interleave(lm, generators: dict) -> dict[str, list]:
    """Advance the generators round-robin, one event each per turn; the lock must be free between events."""
    events = {name: [] for name in generators}
    live = dict(generators)
    while live:
        for name, gen in list(live.items()):
            try:
                events[name].append(next(gen))
            except StopIteration:
                del live[name]
            assert not lm.lock.held_here(), f"{name}: the model's lock is held across a yield"
    return events


def test_interleaved_step_by_step_equals_alone(shared, alone):
    lm, drafter, unlocked = shared
    gens = {name: runner.iterate(lm, PROMPT, cfg, **kwargs_for(name, drafter)) for name, cfg in CONFIGS.items()}
    events = interleave(lm, gens)
    for name, cfg in CONFIGS.items():
        trace = runner.assemble(lm, PROMPT, cfg, events[name], prompt_text="", forced=(),
                                end=runner.RunEnd(1.0, "max_new_tokens"))
        assert without_timings(trace) == alone[name], name
    assert unlocked == []


@pytest.mark.slow
def test_parallel_threads_equal_alone(shared, alone):
    """Five threads (twice over, ten runs) on one model at once, each pausing at random between
    events so their forwards interleave; each trace equals its run alone."""
    lm, drafter, unlocked = shared
    jobs = [(name, rep) for rep in range(2) for name in CONFIGS]
    results, errors = {}, []
    barrier = threading.Barrier(len(jobs))

    def work(name: str, rep: int) -> None:
        pause = random.Random(f"{name}{rep}")

        def on_event(_event):
            assert not lm.lock.held_here()
            threading.Event().wait(pause.random() * 0.004)

        try:
            barrier.wait()
            results[name, rep] = runner.run(lm, PROMPT, CONFIGS[name], on_event=on_event,
                                            **kwargs_for(name, drafter))
        except Exception as err:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{name}/{rep}: {err!r}")

    threads = [threading.Thread(target=work, args=job, name=f"{job[0]}-{job[1]}") for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == sorted(jobs)
    for (name, _rep), trace in results.items():
        assert trace.error is None, (name, trace.error)
        assert without_timings(trace) == alone[name], name
    assert unlocked == []


def test_every_forward_holds_the_lock_and_no_yield_does(shared):
    lm, drafter, unlocked = shared
    for name, cfg in CONFIGS.items():
        for _event in runner.iterate(lm, PROMPT, cfg, **kwargs_for(name, drafter)):
            assert lm.lock.depth == 0, f"{name}: lock held across a yield"
    assert unlocked == []


# ------------------------------------------------------------------ negative controls: the checks bite
def test_control_a_lock_held_across_a_yield_is_caught(shared):
    lm, _, _ = shared

    def holds_across_yield():
        with lm.lock:
            yield 1
            yield 2

    with pytest.raises(AssertionError, match="held across a yield"):
        interleave(lm, {"bad": holds_across_yield()})
    assert lm.lock.depth == 0          # the aborted generator released the lock when it was closed


def test_control_an_unlocked_forward_is_recorded(shared):
    lm, _, unlocked = shared
    before = len(unlocked)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([PROMPT], device=lm.device))
    assert len(unlocked) == before + 1
    del unlocked[before:]


def test_control_shared_random_state_changes_the_traces(shared, alone):
    """Two sampling runs that share one generator (state leaking between sessions) do not reproduce
    their runs alone: the comparison the tests above make would catch such a leak."""
    lm, _, _ = shared
    cfg = CONFIGS["sample"]
    generator = torch.Generator().manual_seed(cfg.seed)
    first = runner.strategy_for(cfg).decode(lm, PROMPT, cfg, generator=generator, forced=[])
    second = runner.strategy_for(cfg).decode(lm, PROMPT, cfg, generator=generator, forced=[])
    events = interleave(lm, {"a": first, "b": second})
    traces = [without_timings(runner.assemble(lm, PROMPT, cfg, events[k], prompt_text="", forced=(),
                                              end=runner.RunEnd(1.0, "max_new_tokens"))) for k in "ab"]
    assert traces[0] != alone["sample"] or traces[1] != alone["sample"]


# ------------------------------------------------------------------ stopping
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_stopped_run_keeps_its_trace(shared, alone, name):
    lm, drafter, _ = shared
    seen: list = []
    trace = runner.run(lm, PROMPT, CONFIGS[name], on_event=seen.append, should_stop=lambda: len(seen) >= 2,
                       **kwargs_for(name, drafter))
    assert trace.stop_reason == "stopped" and trace.error is None
    full = alone[name]
    kept = without_timings(trace)
    assert kept["steps"] == full["steps"][:2]                 # the steps so far, exactly
    assert len(kept["steps"]) < len(full["steps"])
    assert kept["output_ids"] == full["output_ids"][:len(kept["output_ids"])] or name == "beam"
    restored = from_json(to_json(trace))                      # and it saves and loads
    assert without_timings(restored) == kept


# ------------------------------------------------------------------ models sharing modules share the lock
def _draft_forward_during_tap(target, draft) -> tuple[bool, tuple]:
    """Inside the target's head tap, another thread runs the draft (which shares the head module).
    -> (was that thread kept waiting, the shape the tap holds when the tap ends)."""
    from decoding.runtime.hooks import tap_head_input

    thread = threading.Thread(target=lambda: draft.forward(PROMPT[:3], draft.new_cache()))
    with tap_head_input(target) as tap:
        target.forward(PROMPT, target.new_cache())
        thread.start()
        thread.join(timeout=0.5)
        waited = thread.is_alive()
        shape = tuple(tap.hidden.shape)
    thread.join(timeout=60)
    return waited, shape


def test_a_truncated_draft_shares_the_targets_lock():
    from decoding.drafters.draft_model import truncated_draft
    from decoding.runtime.models import LM

    target = varied_llama(seed=1)
    draft = truncated_draft(target, 1)
    assert draft.lock is target.lock
    waited, shape = _draft_forward_during_tap(target, draft)
    assert waited and shape == (1, len(PROMPT), target.model.config.hidden_size)
    # control: the same weight-sharing draft with a lock of its own runs inside the tap and overwrites it
    loose = LM(draft.model, None, name="loose")
    waited, shape = _draft_forward_during_tap(target, loose)
    assert not waited and shape == (1, 3, target.model.config.hidden_size)


def test_a_shallow_draft_shares_the_targets_lock():
    from decoding.drafters.shallow import build_shallow

    target = varied_llama(seed=1)
    draft = build_shallow(target, 1, 1)
    assert draft.lock is target.lock
    assert draft.model.model.layers[0] is target.model.model.layers[0]     # why: it shares modules
