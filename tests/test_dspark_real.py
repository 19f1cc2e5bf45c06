"""dspark on the embedded SmolLM2-135M with an untrained drafter: token-identical to plain greedy
(chain and tree). A divergence reports the target's top-2 logit gap at the first differing token
(only a numerical tie may explain one)."""
from __future__ import annotations

import pytest
import torch
from dspark_helpers import chain_config
from spec_helpers import heldout_prompts

from decoding.core.config import GreedyConfig
from decoding.drafters.parallel import DrafterShape, ParallelDrafter
from decoding.runner import run

pytestmark = pytest.mark.real
N = 32


def top2_gap(lm, prompt, out, at: int) -> float:
    logits = lm.forward(list(prompt) + list(out[:at]), lm.new_cache())[-1]  # (V,)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def test_untrained_drafter_equals_greedy(real_lm, select="tree", k=3, budget=8):
    hidden = real_lm.model.config.hidden_size
    drafter = ParallelDrafter(DrafterShape(hidden, real_lm.vocab_size, gamma_max=8, rank=16, trunk=64, width=64),
                              vocab_ids=range(8000)).attach(real_lm).eval()
    prompt = real_lm.encode("Name three colours of the rainbow.")
    ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=N)).output_ids
    tr = run(real_lm, prompt, chain_config(max_new_tokens=N, gamma=6, top_k_candidates=k, select=select,
                                           budget=budget), drafter=drafter)
    assert tr.error is None
    if tr.output_ids != ref:
        at = next(i for i, (a, b) in enumerate(zip(tr.output_ids, ref)) if a != b)
        pytest.fail(f"diverged at token {at}; target top-2 logit gap there {top2_gap(real_lm, prompt, ref, at):.3g}")
    assert tr.stats.target_forwards == len(tr.steps)


SHIPPED_PROMPTS = ("Explain how a rainbow forms.", "Write a Python function that adds two numbers.",
                   "Give three tips for learning a new language.")


def tokens_per_forward(traces) -> float:
    rounds = [s for tr in traces for s in tr.steps if not s.prefill]
    return sum(len(s.emitted) for s in rounds) / len(rounds)


@pytest.mark.parametrize("select", ["chain", "tree"])
def test_shipped_drafter_equals_greedy_and_accepts(real_lm, select):
    """The shipped drafter (assets/) at temperature 0: output identical to greedy on new and held-out
    prompts; and it is a real drafter: more than 1.8 tokens per target forward on held-out prompts of
    its training distribution, more than 1.2 on the new ones (an untrained drafter gives about 1.0)."""
    from decoding.runtime.paths import PARALLEL_WEIGHTS

    if not PARALLEL_WEIGHTS.is_file():
        pytest.fail(f"shipped drafter weights missing: {PARALLEL_WEIGHTS}")
    traces = {}
    for text in SHIPPED_PROMPTS + tuple(heldout_prompts(2)):
        prompt = real_lm.encode(text)
        ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=48)).output_ids
        tr = run(real_lm, prompt, chain_config(max_new_tokens=48, gamma=8, select=select, budget=12))
        assert tr.error is None and tr.output_ids == ref, text
        traces[text] = tr
    new = tokens_per_forward([traces[t] for t in SHIPPED_PROMPTS])
    held = tokens_per_forward([traces[t] for t in heldout_prompts(2)])
    assert held > 1.8 and new > 1.2, (held, new)


def test_offline_evaluation_predicts_every_runtime_round(real_lm):
    """Training's held-out numbers (the model card's τ) and the runtime measure the same drafter: a
    greedy chain (K = 1, γ = 8) run accepts, round by round, exactly what the offline teacher-forced
    evaluation on the same answer predicts (decoding.train.parallel.chain_rounds) (all rounds but the last,
    which the token budget cuts).
    Control: the offline side fed the hidden state one position late (the state at the root token
    rather than the one that predicted it, a plausible tapping mistake) does not."""
    import dataclasses

    from decoding.drafters.parallel import load_drafter
    from decoding.runtime.paths import PARALLEL_WEIGHTS
    from decoding.train import data as train_data
    from decoding.train import parallel as train

    drafter = load_drafter(PARALLEL_WEIGHTS, real_lm)
    prompt = real_lm.encode("Write a Python function that checks whether a string is a palindrome, with a docstring.")
    n, gamma = 64, 8
    trace = run(real_lm, prompt, chain_config(max_new_tokens=n, gamma=gamma, top_k_candidates=1), drafter=drafter)
    # a round's position is where its first drafted token goes; its anchor is the answer token before it
    runtime = [(s.position - len(prompt) - 1, len(s.accepted_path)) for s in trace.steps if not s.prefill]
    data = train_data.generate_distill(real_lm, [prompt], answer_tokens=n, use_cache=False, progress=False)
    assert data.tokens.tolist() == list(trace.output_ids)                 # the same answer (greedy)
    data = train_data.drafter_data(real_lm, [prompt], data, drafter.shape.feature_layers, use_cache=False,
                                   progress=False)
    offline = train.chain_rounds(drafter, data, gamma)
    assert sum(a for _, a in runtime) >= 5                                 # a drafter that accepts something
    assert runtime[:-1] == offline[:len(runtime) - 1]
    late = dataclasses.replace(data, hidden=torch.cat([data.hidden[1:], data.hidden[-1:]]))
    assert train.chain_rounds(drafter, late, gamma)[:len(runtime) - 1] != runtime[:-1]


COPY_TEXT = ("The museum opens at nine on weekdays and at ten on weekends. Children under twelve enter for "
             "free, and the roof garden closes an hour before the galleries do.")


def test_shipped_drafter_with_lookup_equals_greedy_and_copies(real_lm):
    """Prompt-lookup candidates in the lattice (lookup_max_ngram = 2) on a prompt that asks to rework a
    given text: output identical to greedy, and more tokens per target forward than without them."""
    prompt = real_lm.encode("Rewrite this notice as a short list:\n\n" + COPY_TEXT)
    ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=64)).output_ids
    taus = {}
    for n in (0, 2):
        tr = run(real_lm, prompt, chain_config(max_new_tokens=64, gamma=8, lookup_max_ngram=n))
        if tr.output_ids != ref:
            at = next(i for i, (a, b) in enumerate(zip(tr.output_ids, ref)) if a != b)
            pytest.fail(f"lookup {n}: diverged at token {at}; top-2 logit gap {top2_gap(real_lm, prompt, ref, at):.3g}")
        taus[n] = tr.stats.mean_accepted_length
        assert n == 0 or any(node.lookup and node.verdict == "accepted" for s in tr.steps for node in s.nodes)
    print("tau without/with lookup", taus)
    assert taus[2] > taus[0] + 0.2, taus


def test_tour_dspark_stop_matches_its_prose(real_lm, tmp_path):
    """The tour's DSpark stop (DSpark's defaults) says its 26 tokens take 9 target forwards and what the
    head alone gets per forward: checked against its recording and, with the verify-cost table the
    recording was sized by ("auto" profiles each machine anew), a live run and a run without lookup."""
    import dataclasses

    from decoding.runtime.cost_table import CostTable
    from ui.views import tour

    stop = tour.stop_by_id("dspark")
    recorded = tour.load_recorded(stop)
    assert stop.params == () and tour.stale_fields(stop, recorded) == []
    assert (recorded.stats.new_tokens, recorded.stats.target_forwards) == (26, 9)
    assert "26 tokens take 9 target forwards" in stop.body
    sizes = [s.size for s in recorded.steps if not s.prefill]
    assert sizes and all(s is not None for s in sizes)                  # the defaults size each round by cost
    table = tmp_path / "recorded-cost.json"
    CostTable(sizes[0].verify_ms, overhead_ms=sizes[0].overhead_ms).save(table)
    config = dataclasses.replace(stop.config(), cost_table=str(table))
    tr = run(real_lm, real_lm.encode(stop.prompt), config)
    assert tr.output_ids == recorded.output_ids == run(real_lm, real_lm.encode(stop.prompt),
                                                       GreedyConfig(max_new_tokens=40)).output_ids
    assert (tr.stats.new_tokens, tr.stats.target_forwards) == (26, 9)
    alone = run(real_lm, real_lm.encode(stop.prompt), dataclasses.replace(config, lookup_max_ngram=0))
    assert alone.output_ids == tr.output_ids
    assert f"{alone.stats.new_tokens / alone.stats.target_forwards:.2f} per forward" in stop.body


def test_default_sequential_head_equals_greedy_and_accepts(real_lm):
    """DSpark's defaults (the shipped feature drafter as a sequential head with its calibration, a
    cost-aware tree of at most 8 nodes, prompt lookup in the lattice) at temperature 0: output identical
    to greedy on new prompts, every round one target forward. The head is a real drafter: with the tree
    of 8 verified whole (no cost table) more than 2.2 tokens per target forward (the parallel drafter's
    chain gets about 1.6 there)."""
    from decoding.core.config import DSparkConfig

    fixed = []
    for text in SHIPPED_PROMPTS:
        prompt = real_lm.encode(text)
        ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=48)).output_ids
        for config in (DSparkConfig(max_new_tokens=48), DSparkConfig(max_new_tokens=48, cost_table="none")):
            tr = run(real_lm, prompt, config)
            assert tr.error is None and tr.output_ids == ref, (text, config.cost_table)
            assert tr.stats.target_forwards == len(tr.steps)
        fixed.append(tr)
    assert tokens_per_forward(fixed) > 2.2, tokens_per_forward(fixed)


def test_named_drafter_loads_once_per_file_version(real_lm, tmp_path):
    """A drafter named in the config is loaded once per model and kept; a retrained file at the same
    path (new modification time) loads anew; a missing file raises and leaves nothing behind."""
    import os
    import shutil

    from decoding.core.draft_names import FEATURE_HEAD
    from decoding.core.errors import ConfigError
    from decoding.drafters.factory import load_lattice_drafter
    from decoding.runtime.paths import PARALLEL_WEIGHTS

    assert load_lattice_drafter(real_lm, FEATURE_HEAD) is load_lattice_drafter(real_lm, FEATURE_HEAD)
    path = tmp_path / "drafter.safetensors"
    with pytest.raises(ConfigError):
        load_lattice_drafter(real_lm, str(path))
    shutil.copy(PARALLEL_WEIGHTS, path)
    first = load_lattice_drafter(real_lm, str(path))
    assert load_lattice_drafter(real_lm, str(path)) is first
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_lattice_drafter(real_lm, str(path)) is not first


def test_with_its_trained_files_hidden_the_embedded_model_runs_training_free_and_exact(real_lm, monkeypatch,
                                                                                       tmp_path):
    """The embedded model as any other model a user brings: with no trained drafter matched to it, DSpark and
    speculative decoding at their defaults ("auto") fall back to the training-free sources and stay
    token-identical to greedy."""
    from decoding.core.config import DSparkConfig, SpeculativeConfig
    from decoding.runtime import fingerprint

    monkeypatch.setattr(fingerprint, "DRAFTER_TARGETS", tmp_path / "no-drafter-targets.json")
    prompt = real_lm.encode("Describe a busy train station in the morning.")
    ref = run(real_lm, prompt, GreedyConfig(max_new_tokens=N)).output_ids
    dspark = run(real_lm, prompt, DSparkConfig(max_new_tokens=N))
    assert dspark.error is None and dspark.output_ids == ref
    assert "recycling" in dspark.steps[0].drafting.sources and "feature" not in dspark.steps[0].drafting.sources
    spec = run(real_lm, prompt, SpeculativeConfig(max_new_tokens=N, draft="auto"))
    assert spec.error is None and spec.output_ids == ref
    drafters = {s.drafter for s in spec.steps}
    assert drafters <= {"lookup", "recycling", "lookup+recycling"} and "recycling" in drafters, drafters
    monkeypatch.undo()                            # the record back: auto finds the shipped drafter again
    again = run(real_lm, prompt, SpeculativeConfig(max_new_tokens=N, draft="auto"))
    assert again.output_ids == ref and "feature" in again.steps[0].drafting.sources
