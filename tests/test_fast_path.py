"""The fast path (decoding.runtime.fast_path) against the dynamic-cache path on tiny llamas: every strategy
that decodes one sequence gives the same tokens, the same recorded logits (within the logit tolerance) and
the same KV accounting; tree verification and compaction on a slot continue like a fresh prefill; the
hooks the drafters read fire after a replay with the replay's values. Off CUDA the graphs are EmulatedGraph
(a replay overwrites the first run's output tensors, as a CUDA graph's does); with
DECODESCOPE_TEST_DEVICE=cuda they are real CUDA graphs. A slot stays right through a forward that raises,
a reuse after a run that left NaN in it, and growth past its first capacity. Negative controls: a graph
whose outputs are not refreshed, a mask that shows stale positions, a replay that calls no hooks, a cache
not resynchronised after a failed forward, a slot not zeroed when taken and a growth that copies nothing
each fail these checks."""
from __future__ import annotations

import gc

import pytest
import torch
from app_support import assert_same
from conftest import TEST_DEVICE, logit_atol
from dspark_helpers import chain_config, one_thread, random_drafter, varied_llama

from decoding import from_json, to_json, without_timings
from decoding.core.config import DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.errors import ConfigError, StepError
from decoding.runner import run
from decoding.runtime import fast_path
from decoding.runtime.fast_path import EmulatedGraph, KVLease
from decoding.runtime.hooks import tap_decoder_rows, tap_head_input
from decoding.runtime.models import LM, ModelSpec, kv_memory
from decoding.strategies.tree_verify import compact_cache, verify_tree

TOL = logit_atol(1e-5)
REL = 2e-6      # of the largest |value|: a static cache and a dynamic one run kernels of other shapes, whose
#                 float32 sums round in another order; on one Xeon that moved logits of magnitude 20 by 1.2e-5


def gap_ok(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """got equals ref up to float32 rounding: TOL plus REL of ref's largest magnitude."""
    return float((got - ref).abs().max()) <= TOL + REL * float(ref.abs().max())
PROMPT = [3, 5, 7, 9, 11, 13, 2]
GRAPH = None if TEST_DEVICE.type == "cuda" else EmulatedGraph     # None: torch.cuda.CUDAGraph
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def fast_twin(lm: LM, graph=GRAPH, capacity: int = 128) -> LM:
    """The same model behind a second LM with the fast path on (one lock: they share modules)."""
    return LM(lm.model, lm.tokenizer, name=lm.name + "-fast", lock=lm.lock).use_fast_path(graph, capacity)


@pytest.fixture(scope="module")
def fast(lm):
    return fast_twin(lm)


def assert_same_run(base, fast, config, **kwargs):
    """The same trace apart from timings and the model's name (tokens, verdicts and counts identical, every
    recorded number within assert_same's tolerance), and the recorded raw logits within TOL."""
    a, b = run(base, PROMPT, config, **kwargs), run(fast, PROMPT, config, **kwargs)
    assert a.error is None and b.error is None and len(a.output_ids) > 0
    assert fast.fast.failure is None and any(slot.graphs for slot in fast.fast.slots)    # graphs did replay
    assert_same(plain(b), plain(a))
    assert logit_gap(a, b) <= TOL
    return a, b


def plain(trace) -> dict:
    out = without_timings(from_json(to_json(trace)))
    out.pop("model")
    return out


def logit_gap(a, b) -> float:
    """Largest difference between the two traces' recorded raw logits (greedy/sampling steps)."""
    pairs = [(x.logit, y.logit) for s, t in zip(a.steps, b.steps) for x, y in
             zip(getattr(s, "raw_top", ()), getattr(t, "raw_top", ()))]
    return max((abs(x - y) for x, y in pairs), default=0.0)


@pytest.mark.parametrize("config", [GreedyConfig(max_new_tokens=24, top_n=5),
                                    SampleConfig(max_new_tokens=24, temperature=0.9, top_k=20, seed=4, top_n=5)],
                         ids=["greedy", "sample"])
def test_single_token_steps_match_the_dynamic_cache(lm, fast, config):
    a, _ = assert_same_run(lm, fast, config)
    assert len(set(a.output_ids)) > 3           # the check is not over a collapsed, repeated output


@pytest.mark.slow
def test_speculative_with_lookup_and_a_draft_model_match(lm, fast):
    assert_same_run(lm, fast, SpeculativeConfig(max_new_tokens=30, draft="lookup", gamma=4))
    draft = varied_llama(seed=5)
    config = SpeculativeConfig(max_new_tokens=30, draft="tiny-draft", gamma=3, temperature=0.8, seed=2)
    a, b = assert_same_run(lm, fast, config, drafter=draft)
    b2 = run(fast, PROMPT, config, drafter=fast_twin(draft))
    assert b2.output_ids == a.output_ids
    verdicts = {d.verdict for e in a.steps for d in getattr(e, "drafts", ())}
    assert {"accepted", "rejected"} <= verdicts     # drafts were both accepted and rejected


@pytest.mark.parametrize("select,feature_layers", [("chain", ()), ("tree", ()), ("tree", (0, 1))])
@pytest.mark.slow
def test_dspark_rounds_match_with_the_drafters_taps(lm, fast, select, feature_layers):
    """DSpark's drafter reads the target's LM-head input (and decoder layers) through hooks, which the
    fast path calls after each replay."""
    drafter = random_drafter(lm, gamma_max=8, feature_layers=feature_layers)
    config = chain_config(max_new_tokens=30, gamma=4, top_k_candidates=3, select=select, budget=8)
    a, b = assert_same_run(lm, fast, config, drafter=drafter)
    assert a.output_ids == run(lm, PROMPT, GreedyConfig(max_new_tokens=30)).output_ids
    sampled = DSparkConfig(**{**config.__dict__, "temperature": 0.8, "seed": 3})
    assert_same_run(lm, fast, sampled, drafter=drafter)


def test_tree_verification_and_compaction_on_a_slot(lm, fast):
    tokens, parents = [8, 1, 2, 3, 1, 2, 60, 61, 62], [-1, 0, 0, 0, 1, 2, 3, 6, 7]
    dynamic, lease = lm.new_cache(), fast.sequence_cache()
    assert isinstance(lease, KVLease)
    for lm_, cache in ((lm, dynamic), (fast, lease)):
        lm_.forward(PROMPT, cache)
    ref, got = verify_tree(lm, dynamic, tokens, parents), verify_tree(fast, lease, tokens, parents)
    assert gap_ok(got, ref)
    keep = [0, 3, 6, 7]
    compact_cache(dynamic, len(PROMPT), keep)
    compact_cache(lease, len(PROMPT), keep)
    assert lease.get_seq_length() == dynamic.get_seq_length() == len(PROMPT) + len(keep)
    nxt = [17, 23, 5]
    fresh = lm.forward(PROMPT + [tokens[k] for k in keep] + nxt, lm.new_cache())[-3:]
    assert gap_ok(fast.forward(nxt, lease), fresh)


@pytest.mark.parametrize("keep", [0, 1])
def test_taps_see_each_replay(lm, fast, keep):
    """The head and layer taps (DSpark) and the decoder tap (speculative's feature drafter) read the same
    rows on a slot as on a dynamic cache, step after step (the head's input: the rows logits_to_keep
    gives it)."""
    dynamic, lease = lm.new_cache(), fast.sequence_cache()
    for step in (PROMPT, [4], [6, 8], [10], [12, 14, 16]):
        rows = []
        for lm_, cache in ((lm, dynamic), (fast, lease)):
            with tap_head_input(lm_, (0, 1)) as head, tap_decoder_rows(lm_) as decoder:
                lm_.forward(step, cache, logits_to_keep=keep)
            rows.append((head.hidden, decoder.rows))
        for ref, got in zip(*rows):
            assert got.shape == ref.shape and gap_ok(got, ref)
    assert {2, 3} <= set(lease.slot.graphs)


def test_a_hook_the_replay_cannot_call_sends_the_forward_eager(lm):
    """A pre-hook on a decoder layer (the replay calls layers' forward hooks only), registered after graphs
    replayed, fires on each forward while it is there; once removed, the steps replay again."""
    twin = fast_twin(lm)
    lease, calls, replays = twin.sequence_cache(), [], []
    replay = twin.fast._replay
    twin.fast._replay = lambda *args: replays.append(1) or replay(*args)
    twin.forward(PROMPT, lease)
    twin.forward([4], lease)
    assert len(replays) == 1 and 1 in lease.slot.graphs
    handle = lm.model.model.layers[0].register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        got = twin.forward([6], lease)
    finally:
        handle.remove()
    assert len(calls) == 1 and len(replays) == 1
    assert gap_ok(got, lm.forward(PROMPT + [4, 6], lm.new_cache())[-1:])
    twin.forward([8], lease)
    assert len(replays) == 2


def test_negative_control_a_replay_without_hooks_leaves_the_tap_stale(lm, fast, monkeypatch):
    monkeypatch.setattr(fast_path, "_call_hooks", lambda tapped, outputs, keep: None)
    lease = fast.sequence_cache()
    fast.forward(PROMPT, lease)
    with tap_head_input(fast) as head:
        fast.forward([4], lease)
    assert head.hidden is None


class StaleGraph(EmulatedGraph):
    """A wrong graph: replays return the capture's outputs without recomputing them."""

    def replay(self):
        self.run()
        return self.outputs


def test_negative_control_stale_graph_outputs_are_caught(lm):
    stale = fast_twin(lm, graph=StaleGraph)
    b = run(stale, PROMPT, GreedyConfig(max_new_tokens=12, top_n=5))
    a = run(lm, PROMPT, GreedyConfig(max_new_tokens=12, top_n=5))
    assert b.output_ids != a.output_ids or logit_gap(a, b) > TOL


def test_negative_control_a_mask_that_shows_stale_positions_is_caught(lm, fast, monkeypatch):
    """A roll-back only moves the length: the mask must hide what lies beyond it."""
    def shows_everything(allowed, past, capacity, dtype):
        return torch.zeros(1, 1, allowed.shape[0], capacity, dtype=dtype)

    monkeypatch.setattr(fast_path, "block_mask", shows_everything)
    lease = fast.sequence_cache()
    got = fast.forward(PROMPT, lease)
    ref = lm.forward(PROMPT, lm.new_cache())
    assert not gap_ok(got, ref)


def failing_layer(lm):
    """A forward hook on decoder layer 1 that raises: mid-forward when eager, after the replay otherwise."""
    def boom(module, args, output):
        raise RuntimeError("simulated failure")
    return lm.model.model.layers[1].register_forward_hook(boom)


@pytest.mark.parametrize("resync", [True, False], ids=["resync", "control-no-resync"])
@pytest.mark.parametrize("rows", [1, 40], ids=["replay", "eager"])
def test_a_forward_that_raises_leaves_the_cache_as_it_was(lm, monkeypatch, rows, resync):
    twin = fast_twin(lm)
    lease = twin.sequence_cache()
    twin.forward(PROMPT, lease)
    twin.forward([4], lease)                    # the 1-row graph captured
    if not resync:
        monkeypatch.setattr(fast_path.StaticKV, "resync", lambda self: None)
    handle = failing_layer(lm)
    try:
        with pytest.raises(RuntimeError, match="simulated failure"):
            twin.forward(list(range(20, 20 + rows)), lease)
    finally:
        handle.remove()
    assert lease.get_seq_length() == len(PROMPT) + 1
    assert gap_ok(twin.forward([6], lease), lm.forward(PROMPT + [4, 6], lm.new_cache())[-1:]) == resync


@pytest.mark.parametrize("zeroed", [True, False], ids=["zeroed", "control-not-zeroed"])
def test_a_slot_taken_again_reads_nothing_of_the_last_run(lm, monkeypatch, zeroed):
    """A run that left NaN in its cache (past the valid length too) does not reach the next run's logits:
    masked out is not enough, since 0 x NaN is NaN."""
    twin = fast_twin(lm)
    lease = twin.sequence_cache()
    twin.forward(PROMPT, lease)
    with torch.inference_mode():
        for layer in lease.kv.layers:
            layer.keys.fill_(float("nan"))
            layer.values.fill_(float("nan"))
    slot = lease.slot
    del lease
    gc.collect()
    if not zeroed:
        monkeypatch.setattr(fast_path.StaticKV, "clear", lambda self: (setattr(self, "length", 0), self.resync()))
    again = twin.sequence_cache()
    assert again.slot is slot
    if not zeroed:
        with pytest.raises(StepError, match="logits: NaN"):
            twin.forward(PROMPT[:3], again)
        return
    got = twin.forward(PROMPT[:3], again)
    assert gap_ok(got, lm.forward(PROMPT[:3], lm.new_cache()))


def test_a_slot_grows_to_fit_and_captures_its_graphs_again(lm, monkeypatch):
    monkeypatch.setattr(fast_path, "FIRST_CAPACITY", 8)
    twin = fast_twin(lm, capacity=40)
    a, b = assert_same_run(lm, twin, GreedyConfig(max_new_tokens=30, top_n=5))
    slot = twin.fast.slots[0]
    assert slot.kv.capacity == 40 and 1 in slot.graphs          # 8 -> 16 -> 32 -> 40 (the cap)
    assert "1 slot of 40 positions, up to 40" in twin.describe()["fast_path"]


def test_negative_control_a_growth_that_copies_nothing_is_caught(lm, monkeypatch):
    monkeypatch.setattr(fast_path, "FIRST_CAPACITY", 8)

    def empty_copy(self, model, capacity):
        fresh = fast_path.StaticKV(model, capacity)
        fresh.length = self.length
        return fresh

    monkeypatch.setattr(fast_path.StaticKV, "grown", empty_copy)
    twin = fast_twin(lm, capacity=40)
    config = GreedyConfig(max_new_tokens=30, top_n=5)
    a, b = run(lm, PROMPT, config), run(twin, PROMPT, config)
    assert b.output_ids != a.output_ids or logit_gap(a, b) > TOL


def test_slots_are_reused_and_limited(lm):
    twin = fast_twin(lm)
    first = twin.sequence_cache()
    twin.forward(PROMPT, first)
    slot = first.slot
    del first
    gc.collect()
    again = twin.sequence_cache()
    assert again.slot is slot and again.get_seq_length() == 0   # the freed slot, emptied
    held = [again] + [twin.sequence_cache() for _ in range(fast_path.SLOTS - 1)]
    assert all(isinstance(c, KVLease) for c in held)
    assert not isinstance(twin.sequence_cache(), KVLease)      # beyond SLOTS: a dynamic cache
    assert len(twin.fast.slots) == fast_path.SLOTS


def test_graphs_are_kept_per_row_count(lm):
    twin = fast_twin(lm)
    run(twin, PROMPT, SpeculativeConfig(max_new_tokens=12, draft="lookup", gamma=3))
    counts = {n for slot in twin.fast.slots for n in slot.graphs}
    assert 1 in counts and counts <= set(range(1, 5))        # steps and 4-token verifications; prompts eager
    assert twin.fast.failure is None and f"and {len(counts)} graphs" in twin.describe()["fast_path"]


def test_long_forwards_run_eagerly_on_the_slot(lm, monkeypatch):
    monkeypatch.setattr(fast_path, "GRAPH_ROWS", 2)
    twin = fast_twin(lm)
    lease = twin.sequence_cache()
    twin.forward(PROMPT[:4], lease)
    got = twin.forward(PROMPT[4:], lease)                     # 3 rows after a prefix: eager
    assert lease.slot.graphs == {}
    assert gap_ok(got, lm.forward(PROMPT, lm.new_cache())[4:])


def test_a_failed_capture_falls_back_to_eager_forwards(lm):
    class Broken(EmulatedGraph):
        def capture(self, run, undo):
            run()
            raise RuntimeError("operation not permitted when stream is capturing")

    twin = fast_twin(lm, graph=Broken)
    a = run(lm, PROMPT, GreedyConfig(max_new_tokens=10, top_n=5))
    b = run(twin, PROMPT, GreedyConfig(max_new_tokens=10, top_n=5))
    assert b.output_ids == a.output_ids and logit_gap(a, b) <= TOL
    assert "capture of" in twin.describe()["fast_path"]


@pytest.mark.skipif(TEST_DEVICE.type != "cuda", reason="a real CUDA graph capture")
def test_a_real_capture_that_fails_runs_eagerly_and_restores_the_stream(lm):
    """A forward that syncs with the host cannot be captured: the run goes on eagerly with the same trace,
    says why, and leaves the stream it ran on current."""
    layer = lm.model.model.layers[0]
    forward = layer.forward

    def syncing(*args, **kwargs):
        out = forward(*args, **kwargs)
        float((out[0] if isinstance(out, tuple) else out).sum())      # not permitted while capturing
        return out

    twin, stream = fast_twin(lm), torch.cuda.current_stream()
    a = run(lm, PROMPT, GreedyConfig(max_new_tokens=10, top_n=5))
    layer.forward = syncing
    try:
        b = run(twin, PROMPT, GreedyConfig(max_new_tokens=10, top_n=5))
    finally:
        del layer.forward
    assert torch.cuda.current_stream() == stream
    assert twin.fast.failure is not None and "capture of 1 rows failed" in twin.describe()["fast_path"]
    assert b.output_ids == a.output_ids and logit_gap(a, b) <= TOL


def test_kv_memory_counts_valid_positions(lm, fast):
    lease, dynamic = fast.sequence_cache(), lm.new_cache()
    for lm_, cache in ((fast, lease), (lm, dynamic)):
        lm_.forward(PROMPT, cache)
        cache.crop(-2)
    assert kv_memory(lease) == kv_memory(dynamic)


def test_bad_use_is_one_line(lm, fast):
    lease = fast.sequence_cache()
    fast.forward(PROMPT, lease)
    with pytest.raises(ConfigError, match=r"tokens_to_remove=-8 is invalid: must be in \[-7, 0\]"):
        lease.crop(-8)
    with pytest.raises(ConfigError, match=r"tokens=129 is invalid: exceed the fast path's cache of 128"):
        fast.forward(list(range(122)), lease)
    if TEST_DEVICE.type != "cuda":
        with pytest.raises(ConfigError, match=r"fast_path=True is invalid: needs a CUDA device"):
            LM(lm.model, None, "x", lock=lm.lock).use_fast_path()
    with pytest.raises(ConfigError, match=r"fast_path=True is invalid: needs the whole model on one GPU"):
        ModelSpec(fast_path=True, device_map="auto")
    with pytest.raises(ConfigError, match=r"fast_path='yes' is invalid: must be true or false"):
        ModelSpec(fast_path="yes")


def test_attention_without_4d_masks_is_refused():
    model = varied_llama(seed=1).model
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match=r"fast_path=True is invalid: needs attention sdpa or eager"):
        LM(model, None, "flash").use_fast_path(EmulatedGraph)
