"""Compare's lockstep runner: every lane takes one step per turn, in the lanes' order; each lane's trace
equals its run alone (timings aside); a lane refused before its first step, or failing mid-way, keeps
what it has while the others go on; Stop ends every lane with its trace; each lane is timed by its own
steps, after a warm-up that no lane pays for."""
from __future__ import annotations

import pytest
from dspark_helpers import one_thread, random_drafter, varied_llama
from lane_configs import CONFIGS, PROMPT, kwargs_for

from decoding import runner
from decoding.core.config import DSparkConfig, GreedyConfig
from decoding.core.trace import without_timings

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def lm_and_drafter():
    lm = varied_llama(seed=0)
    return lm, random_drafter(lm, gamma_max=8)


def lanes_of(drafter, names=tuple(CONFIGS)) -> dict:
    return {f"{i + 1}: {name}": (CONFIGS[name], kwargs_for(name, drafter)) for i, name in enumerate(names)}


def in_lockstep(order: list[str], lengths: dict[str, int]) -> bool:
    """Whether `order` (the label of each event as it came) is round-robin over the lanes: turn t holds
    the t-th event of every lane that has one, in the lanes' order."""
    labels = list(lengths)
    expected = [label for t in range(max(lengths.values())) for label in labels if t < lengths[label]]
    return order == expected


def test_every_lane_equals_its_run_alone(lm_and_drafter):
    lm, drafter = lm_and_drafter
    order: list[str] = []
    traces = runner.run_lockstep(lm, PROMPT, lanes_of(drafter), on_event=lambda label, _e: order.append(label))
    for label, trace in traces.items():
        name = label.split(": ")[1]
        alone = runner.run(lm, PROMPT, CONFIGS[name], **kwargs_for(name, drafter))
        assert without_timings(trace) == without_timings(alone), label
        assert trace.error is None and len(trace.steps) >= 2
    lengths = {label: len(t.steps) for label, t in traces.items()}
    assert in_lockstep(order, lengths)
    assert len(set(lengths.values())) > 1        # lanes of different lengths: the ones left go on alone


def test_the_lockstep_check_refuses_lanes_run_one_after_another():
    """Negative control for in_lockstep: the order of sequential runs is not round-robin."""
    lengths = {"a": 3, "b": 2}
    assert in_lockstep(["a", "b", "a", "b", "a"], lengths)
    assert not in_lockstep(["a", "a", "a", "b", "b"], lengths)
    assert not in_lockstep(["b", "a", "b", "a", "a"], lengths)


def test_a_refused_lane_reports_its_error_and_the_others_run(lm_and_drafter):
    lm, drafter = lm_and_drafter
    lanes = {"1: greedy": (GreedyConfig(max_new_tokens=6), {}),
             "2: dspark": (DSparkConfig(max_new_tokens=6, drafter="/nonexistent/drafter.safetensors"), {}),
             "3: too long": (GreedyConfig(max_new_tokens=10_000), {})}
    traces = runner.run_lockstep(lm, PROMPT, lanes)
    assert traces["1: greedy"].error is None and len(traces["1: greedy"].output_ids) == 6
    for label in ("2: dspark", "3: too long"):
        assert traces[label].steps == () and traces[label].stop_reason == "error"
    assert "drafter" in traces["2: dspark"].error and "max_new_tokens" in traces["3: too long"].error
    assert "\n" not in traces["2: dspark"].error


def test_stop_ends_every_lane_and_keeps_its_trace(lm_and_drafter):
    lm, drafter = lm_and_drafter
    turns = []
    traces = runner.run_lockstep(lm, PROMPT, lanes_of(drafter, ("greedy", "sample")),
                                 on_event=lambda label, _e: turns.append(label), should_stop=lambda: len(turns) >= 6)
    assert all(t.stop_reason == "stopped" and len(t.steps) == 3 for t in traces.values())
    assert without_timings(traces["1: greedy"])["output_ids"] == \
        list(runner.run(lm, PROMPT, CONFIGS["greedy"]).output_ids[:3])


def test_each_lane_is_timed_by_its_own_steps_after_a_warm_up(lm_and_drafter, monkeypatch):
    """wall_s is the lane's own time: a lane whose steps are slowed shows it, the other does not; the
    warm-up forwards come before the first step and are nobody's."""
    import time

    lm, drafter = lm_and_drafter
    calls: list[str] = []
    forward = lm.forward

    def traced(ids, cache, *args, **kwargs):
        calls.append("fwd")
        return forward(ids, cache, *args, **kwargs)

    monkeypatch.setattr(lm, "forward", traced)
    slow = runner.iterate

    def slow_sample(lm_, prompt, config, **kw):
        gen = slow(lm_, prompt, config, **kw)
        if config.strategy != "sample":
            return gen
        return (time.sleep(0.02) or e for e in gen)

    monkeypatch.setattr(runner, "iterate", slow_sample)
    traces = runner.run_lockstep(lm, PROMPT, lanes_of(drafter, ("greedy", "sample")),
                                 on_event=lambda label, _e: calls.append(label))
    assert calls[:2] == ["fwd", "fwd"] and calls[2] == "fwd" and calls[3] == "1: greedy"
    greedy, sample = traces["1: greedy"], traces["2: sample"]
    assert sample.stats.wall_s >= 0.02 * len(sample.steps)
    assert greedy.stats.wall_s < 0.02 * len(greedy.steps)
    cold = runner.run_lockstep(lm, PROMPT, lanes_of(drafter, ("greedy",)), warm=False,
                               on_event=lambda label, _e: calls.append(label))
    assert cold["1: greedy"].output_ids == greedy.output_ids


@pytest.mark.slow
def test_load_warms_the_model_up(tmp_path, monkeypatch):
    """decoding.runtime.models.load runs two throwaway forwards before returning, on a cache of their own."""
    from bench.tiny_model import build_tiny_model_dir
    from decoding.runtime import models

    directory = build_tiny_model_dir(tmp_path / "tiny")
    calls = []
    forward = models.LM.forward

    def counted(self, ids, cache, *args, **kwargs):
        calls.append((len(ids), cache))        # the cache itself: an id could be reused once it is freed
        return forward(self, ids, cache, *args, **kwargs)

    monkeypatch.setattr(models.LM, "forward", counted)
    lm = models.load(models.ModelSpec(name=str(directory)))
    assert [n for n, _ in calls] == [8, 1] and calls[0][1] is calls[1][1]
    runner.run(lm, [1, 2, 3], GreedyConfig(max_new_tokens=3))
    assert len(calls) == 2 + 3 and calls[2][1] is not calls[0][1]   # the run uses a cache of its own


def test_warm_up_leaves_errors_to_the_run(lm_and_drafter, monkeypatch):
    from decoding.core.errors import StepError

    lm, _ = lm_and_drafter

    def broken(*args, **kwargs):
        raise StepError("logits", "NaN", "(test)")

    monkeypatch.setattr(lm, "forward", broken)
    assert lm.warm_up([1, 2, 3]) is lm
    trace = runner.run(lm, [1, 2, 3], GreedyConfig(max_new_tokens=3))
    assert trace.stop_reason == "error" and "NaN" in trace.error and trace.steps == ()
