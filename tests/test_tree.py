"""Tree verification in one forward on a tiny llama: every node's logits equal a fresh per-path
recomputation (max abs error <= 1e-5; measured ~6e-8 under sdpa), the compacted cache continues
exactly like a fresh prefill of prompt + accepted path, and the negative controls (sequential
positions, a causal-only mask, a boolean mask under eager, tail-cropping) fail the same checks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import logit_atol, make_tiny_llama, on_test_device

from decoding.core.acceptance import greedy_round
from decoding.core.errors import ConfigError
from decoding.lab.toy import MarkovTable, draft_lattice
from decoding.runtime.models import LM
from decoding.strategies.dspark_select import best_tree, flat_tree
from decoding.strategies.tree_verify import compact_cache, tree_mask, tree_positions, verify_tree

TOL = logit_atol(1e-5)
PROMPT = [3, 5, 7, 9, 11, 13, 2]
TREES = [
    ([4], [-1]),                                            # root only
    ([4, 10, 20, 30], [-1, 0, 1, 2]),                       # a chain
    ([4, 10, 20, 30, 40, 50], [-1, 0, 0, 1, 1, 2]),          # branching
    ([8, 1, 2, 3, 1, 2, 60, 61, 62], [-1, 0, 0, 0, 1, 2, 3, 6, 7]),  # repeated tokens, deep branch
]


@pytest.fixture(scope="module")
def lm_sdpa():
    return LM(make_tiny_llama(seed=3), tokenizer=None, name="tiny-sdpa")


@pytest.fixture(scope="module")
def lm_eager():
    model = make_tiny_llama(seed=3)
    model.set_attn_implementation("eager")
    return LM(model, tokenizer=None, name="tiny-eager")


@pytest.fixture(scope="module")
def lm_gqa():
    """Grouped-query attention (2 key/value heads for 4 query heads), as in SmolLM2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LM(on_test_device(LlamaForCausalLM(cfg).eval()), tokenizer=None, name="tiny-gqa")


def path_tokens(tokens, parents, node):
    out = []
    while node != -1:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def per_path_error(lm, tokens, parents, tree_logits) -> float:
    """Max abs difference between tree rows and a fresh forward of prompt + each node's path."""
    err = 0.0
    for node in range(len(tokens)):
        ref = lm.forward(PROMPT + path_tokens(tokens, parents, node), lm.new_cache())[-1]  # (V,)
        err = max(err, float((ref - tree_logits[node]).abs().max()))
    return err


def prefilled(lm):
    cache = lm.new_cache()
    lm.forward(PROMPT, cache)
    return cache


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("which", ["lm_sdpa", "lm_eager", "lm_gqa"])
def test_tree_logits_equal_per_path_recomputation(tree, which, request):
    lm = request.getfixturevalue(which)
    tokens, parents = tree
    cache = prefilled(lm)
    logits = verify_tree(lm, cache, tokens, parents)
    assert logits.shape == (len(tokens), lm.vocab_size)
    assert cache.get_seq_length() == len(PROMPT) + len(tokens)
    assert per_path_error(lm, tokens, parents, logits) <= TOL


def _forward_with(lm, cache, tokens, mask, positions):
    ids = torch.tensor([tokens], device=lm.device)  # (1, q)
    mask, positions = mask.to(lm.device), positions.to(lm.device)
    mask = mask if mask.dtype == torch.bool else mask.to(lm.dtype)
    with torch.inference_mode():
        return lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, **{lm.cache_kw: cache},
                        use_cache=True).logits[0].float()  # (q, V)


def test_negative_controls_fail_the_recomputation_check(lm_sdpa, lm_eager):
    tokens, parents = TREES[2]
    past = len(PROMPT)
    mask = tree_mask(parents, past, lm_sdpa.dtype)
    sequential = torch.arange(past, past + len(tokens))[None]  # (1, q) no depth positions
    wrong_pos = _forward_with(lm_sdpa, prefilled(lm_sdpa), tokens, mask, sequential)
    assert per_path_error(lm_sdpa, tokens, parents, wrong_pos) > TOL
    causal = torch.zeros(1, 1, len(tokens), past + len(tokens))
    causal[..., past:] = torch.triu(torch.full((len(tokens), len(tokens)), torch.finfo(lm_sdpa.dtype).min), 1)
    wrong_mask = _forward_with(lm_sdpa, prefilled(lm_sdpa), tokens, causal, tree_positions(parents, past))
    assert per_path_error(lm_sdpa, tokens, parents, wrong_mask) > TOL
    boolean = mask == 0   # True = allowed: sdpa reads it right, eager adds it as 0/1
    wrong_eager = _forward_with(lm_eager, prefilled(lm_eager), tokens, boolean, tree_positions(parents, past))
    assert per_path_error(lm_eager, tokens, parents, wrong_eager) > TOL


@pytest.mark.parametrize("keep", [[0], [0, 1], [0, 2, 5], [0, 1, 4]])
def test_compacted_cache_continues_like_a_fresh_prefill(lm_sdpa, keep):
    tokens, parents = TREES[2]
    cache = prefilled(lm_sdpa)
    verify_tree(lm_sdpa, cache, tokens, parents)
    compact_cache(cache, len(PROMPT), keep)
    accepted = [tokens[k] for k in keep]
    assert cache.get_seq_length() == len(PROMPT) + len(keep)
    nxt = [17, 23]
    got = lm_sdpa.forward(nxt, cache)  # (2, V)
    ref = lm_sdpa.forward(PROMPT + accepted + nxt, lm_sdpa.new_cache())[-2:]  # (2, V)
    assert float((got - ref).abs().max()) <= TOL


def test_tail_crop_is_not_a_compaction(lm_sdpa):
    """Negative control: cropping the tail keeps nodes 0..m in flattened order, not the path."""
    tokens, parents = TREES[2]
    keep = [0, 2, 5]
    cache = prefilled(lm_sdpa)
    verify_tree(lm_sdpa, cache, tokens, parents)
    cache.crop(-(len(tokens) - len(keep)))
    got = lm_sdpa.forward([17], cache)[-1]
    ref = lm_sdpa.forward(PROMPT + [tokens[k] for k in keep] + [17], lm_sdpa.new_cache())[-1]
    assert float((got - ref).abs().max()) > TOL


def test_greedy_tree_rounds_on_tiny_llama_equal_plain_greedy(lm_sdpa):
    """End to end at temperature 0: draft trees from an unrelated toy drafter, one forward per
    round, the greedy rule, compaction; 24 tokens identical to plain greedy."""
    cache, expect = prefilled(lm_sdpa), []
    feed = list(PROMPT)
    plain = lm_sdpa.new_cache()
    for _ in range(24):
        token = int(torch.argmax(lm_sdpa.forward(feed, plain)[-1]))
        expect.append(token)
        feed = [token]
    with torch.inference_mode():   # a Markov drafter: the tiny model's next token after one token
        single = (lm_sdpa.model(input_ids=torch.arange(64, device=lm_sdpa.device)[:, None])
                  .logits[:, -1].float().softmax(-1))  # (V, V)
    draft = MarkovTable(tuple(tuple(row) for row in single.tolist()))
    cache = lm_sdpa.new_cache()
    lm_sdpa.forward(PROMPT[:-1], cache)
    out, root, rounds = [], PROMPT[-1], 0
    while len(out) < 24:
        tokens, parents = flat_tree(root, best_tree(draft_lattice(draft, root, 3, 2), 6))
        past = cache.get_seq_length()
        logits = verify_tree(lm_sdpa, cache, tokens, parents)
        result = greedy_round(tokens, parents, logits)
        compact_cache(cache, past, [0, *result.accepted])
        out.extend(result.emitted)
        root, rounds = result.next_token, rounds + 1
    assert out[:24] == expect
    assert rounds < 20          # some drafts were accepted, so compaction kept real nodes


def test_refuses_attention_that_ignores_custom_masks(lm_sdpa):
    fake = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2")),
                           device=torch.device("cpu"), dtype=torch.float32, lock=lm_sdpa.lock)
    with pytest.raises(ConfigError, match="attn_implementation"):
        verify_tree(fake, prefilled(lm_sdpa), [1], [-1])


def test_compaction_refuses_bad_input_and_layers_it_cannot_roll_back(lm_sdpa):
    """Sliding-window layers are rolled back (tests/test_arch_matrix.py); a static sliding layer, which
    overwrites what falls out of its window, is refused."""
    from transformers.cache_utils import StaticSlidingWindowLayer

    cache = prefilled(lm_sdpa)
    verify_tree(lm_sdpa, cache, [1, 2], [-1, 0])
    with pytest.raises(ConfigError, match="keep"):
        compact_cache(cache, len(PROMPT), [0, 2])
    with pytest.raises(ConfigError, match="keep"):
        compact_cache(cache, len(PROMPT), [0, 0])
    static_sliding = SimpleNamespace(get_seq_length=lambda: 3, layers=[StaticSlidingWindowLayer(8, 4)])
    with pytest.raises(ConfigError, match="cannot be rolled back"):
        compact_cache(static_sliding, 1, [0])
    with pytest.raises(ConfigError, match="parents"):
        tree_mask([-1, 1], 0)


@pytest.mark.real
def test_tree_logits_on_the_embedded_model(real_lm):
    """SmolLM2 (30 layers, fp32): tree rows vs per-path recomputation measured 6e-5 here, the same
    order as one-shot vs incremental forwards of the same tokens (8e-5); the tolerance is 5e-4 (logits
    reach ~37). Without depth positions the error was ~20."""
    prompt = real_lm.encode("Explain why the sky is blue in two sentences.")
    tokens, parents = [28, 253, 314, 1528, 30, 2], [-1, 0, 0, 1, 1, 2]
    refs = [real_lm.forward(prompt + path_tokens(tokens, parents, i), real_lm.new_cache())[-1]
            for i in range(len(tokens))]
    cache = real_lm.new_cache()
    real_lm.forward(prompt, cache)
    logits = verify_tree(real_lm, cache, tokens, parents)
    assert max(float((ref - logits[i]).abs().max()) for i, ref in enumerate(refs)) <= 5e-4
    cache = real_lm.new_cache()
    real_lm.forward(prompt, cache)
    past = len(prompt)
    wrong = _forward_with(real_lm, cache, tokens, tree_mask(parents, past),
                          torch.arange(past, past + len(tokens))[None])
    assert max(float((ref - wrong[i]).abs().max()) for i, ref in enumerate(refs)) > 5e-4
