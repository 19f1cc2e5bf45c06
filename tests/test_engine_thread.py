"""The engine thread (decoding/runtime/engine_thread.py): when enabled, loading and every step of a run happen on
one thread whichever thread asks, with the same traces; calls from many threads queue one step at a
time; errors and the end of a generator reach the caller; disabled, everything runs in the caller."""
from __future__ import annotations

import threading

import pytest
import torch
from dspark_helpers import one_thread, random_drafter, varied_llama
from lane_configs import CONFIGS, PROMPT, kwargs_for

from decoding import runner
from decoding.core.config import GreedyConfig
from decoding.core.trace import without_timings
from decoding.runtime.engine_thread import ENGINE, EngineThread

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture
def engine():
    worker = EngineThread("test-engine")
    worker.enable()
    yield worker
    worker.disable()


def test_call_runs_on_the_engine_thread_and_raises_there(engine):
    here = threading.get_ident()
    assert engine.call(threading.get_ident) != here
    assert engine.call(lambda: engine.on_it()) and not engine.on_it()
    assert engine.call(lambda: engine.call(threading.get_ident)) == engine.call(threading.get_ident)  # re-entrant
    with pytest.raises(ValueError, match="bad"):
        engine.call(lambda: (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(StopIteration):
        engine.call(next, iter(()))


def test_disabled_calls_run_in_the_caller():
    worker = EngineThread("off")
    assert not worker.enabled and worker.call(threading.get_ident) == threading.get_ident()
    gen = iter([1, 2])
    assert worker.steps(gen) is gen
    worker.enable()
    assert worker.call(threading.get_ident) != threading.get_ident()
    worker.disable()
    assert not worker.enabled and worker.call(threading.get_ident) == threading.get_ident()


def test_steps_advance_the_generator_on_the_engine_thread(engine):
    where = []

    def gen():
        for i in range(3):
            where.append(threading.get_ident())
            yield i

    assert list(engine.steps(gen())) == [0, 1, 2]
    assert len(set(where)) == 1 and where[0] == engine.call(threading.get_ident)


@pytest.fixture(scope="module")
def lm_and_drafter():
    lm = varied_llama(seed=0)
    return lm, random_drafter(lm, gamma_max=8)


def test_every_strategy_runs_on_the_engine_thread_with_the_same_trace(lm_and_drafter):
    """Enabled (as the app enables it), each strategy's forwards all happen on one thread, not the
    caller's, and its trace equals the trace of the run in the caller's thread."""
    lm, drafter = lm_and_drafter
    alone = {name: without_timings(runner.run(lm, PROMPT, cfg, **kwargs_for(name, drafter)))
             for name, cfg in CONFIGS.items()}
    threads: set[int] = set()
    hook = lm.model.register_forward_pre_hook(lambda module, args: threads.add(threading.get_ident()))
    ENGINE.enable()
    try:
        for name, cfg in CONFIGS.items():
            assert without_timings(runner.run(lm, PROMPT, cfg, **kwargs_for(name, drafter))) == alone[name], name
        engine_ident = ENGINE.call(threading.get_ident)
    finally:
        ENGINE.disable()
        hook.remove()
    assert threads == {engine_ident} and threading.get_ident() not in threads


def test_sessions_in_many_threads_take_turns_step_by_step(lm_and_drafter):
    """Four threads stepping at once: their steps interleave on the one engine thread and each run
    gives its trace alone."""
    lm, _ = lm_and_drafter
    config = GreedyConfig(max_new_tokens=12)
    alone = without_timings(runner.run(lm, PROMPT, config))
    order, results = [], {}
    barrier = threading.Barrier(4)

    def session(name: str) -> None:
        barrier.wait()
        results[name] = runner.run(lm, PROMPT, config, on_event=lambda _e: order.append(name))

    ENGINE.enable()
    try:
        workers = [threading.Thread(target=session, args=(f"s{i}",)) for i in range(4)]
        [w.start() for w in workers]
        [w.join() for w in workers]
    finally:
        ENGINE.disable()
    assert all(without_timings(t) == alone for t in results.values())
    switches = sum(1 for a, b in zip(order, order[1:]) if a != b)
    assert switches >= 8, order                     # not one session after another (that is 3 switches)


def test_app_leaves_one_core_to_its_ui_unless_omp_num_threads_says():
    from decoding.runtime.engine_thread import threads_beside_ui

    assert [threads_beside_ui(n, env={}) for n in (1, 2, 8)] == [1, 1, 7]
    assert threads_beside_ui(env={}) == max(1, torch.get_num_threads() - 1)   # torch's own count by default
    assert threads_beside_ui(8, env={"OMP_NUM_THREADS": "8"}) is None
    assert threads_beside_ui(2, env={"OMP_NUM_THREADS": ""}) == 1      # set but empty: not a choice


def _fresh_thread_count() -> int:
    out = []
    worker = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    worker.start()
    worker.join()
    return out[0]


@pytest.fixture
def three_threads():
    """torch at 3 threads in this test (a count no machine default here gives), restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_enable_sets_the_engine_threads_count_and_disable_puts_it_back(three_threads):
    worker = EngineThread("threads")
    worker.enable(threads=2)
    assert worker.call(torch.get_num_threads) == 2 == worker.threads
    assert torch.get_num_threads() == 3            # the caller's own count is left alone
    worker.disable()
    assert _fresh_thread_count() == 3 and worker.threads is None   # later threads: the count from before
    plain = EngineThread("plain")
    plain.enable()                                 # no count given: the engine thread keeps the default
    assert plain.call(torch.get_num_threads) == 3 == plain.threads
    plain.disable()


def test_call_wide_runs_with_the_count_from_before_enable_and_narrows_again(three_threads):
    worker = EngineThread("wide")
    worker.enable(threads=1)
    assert worker.call_wide(torch.get_num_threads) == 3
    assert worker.call(torch.get_num_threads) == 1
    with pytest.raises(ValueError, match="bad"):
        worker.call_wide(lambda: (_ for _ in ()).throw(ValueError("bad")))
    assert worker.call(torch.get_num_threads) == 1     # narrowed again after an error too
    worker.disable()
    plain = EngineThread("plain-wide")                 # enabled without a count: wide is the same
    plain.enable()
    assert plain.call_wide(torch.get_num_threads) == plain.call(torch.get_num_threads) == 3
    plain.disable()


def test_owners_take_turns_one_unit_of_work_each(engine):
    """A fake job queue: while the engine is held, one owner queues a long run (four steps), another a
    single Step, a third two steps. Served in turn, the Step comes second, not after the whole run (a
    first-come queue would serve run0..run3 first)."""
    gate, order = threading.Event(), []
    held = engine.submit("gate", gate.wait)
    jobs = [engine.submit(owner, order.append, f"{owner}{i}")
            for owner, n in (("run", 4), ("step", 1), ("other", 2)) for i in range(n)]
    assert engine.others_ahead("new") == 4 and engine.others_ahead("run") == 3
    gate.set()
    held.result()
    [job.result() for job in jobs]
    assert order == ["run0", "step0", "other0", "run1", "other1", "run2", "run3"]
    assert engine.queued_owners() == 0 and engine.others_ahead("new") == 0   # nothing kept per owner


def test_a_step_waits_behind_one_step_of_a_run_to_end(engine):
    """One session steps a generator to its end on the engine thread (as Run to end does); another
    session's Step, asked for while the run's second step runs, is served before the run's third."""
    order, asked, step_queued = [], threading.Event(), threading.Event()

    def run_to_end():
        for i in range(4):
            if i == 1:
                asked.set()
                step_queued.wait()         # the other session's Step is queued before this step ends
            order.append(f"run{i}")
            yield i

    def other_session():
        asked.wait()
        job = engine.submit(None, order.append, "step")
        step_queued.set()
        job.result()

    other = threading.Thread(target=other_session)
    other.start()
    assert list(engine.steps(run_to_end())) == [0, 1, 2, 3]
    other.join()
    assert order == ["run0", "run1", "step", "run2", "run3"]
    assert engine.others_ahead() == 0
