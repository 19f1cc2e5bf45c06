"""Every architecture a user brings: tiny random models (the embedded tokenizer's vocabulary, 2 layers,
hidden 32) of fifteen transformers architectures, sliding windows of 16 tokens where the config has one,
on a context of 50 tokens (a 30-token prompt and 20 new), so that every round after the prompt rolls back
past the window. Each runs greedy, beam and sampling against transformers' `generate`, and speculative
decoding (auto, lookup, the model as its own draft) and DSpark (defaults, chain, tree) against greedy,
token for token; the runs are checked to have rejected drafts (a rollback happened) past the window.
Where an architecture cannot run a strategy (a draft tree on bloom: ALiBi, no position ids) the run is
refused before it starts, in one line naming it. Negative controls: a rollback that keeps the oldest
positions of a sliding window instead of the newest, and one that forgets to drop the rejected drafts,
break the identity with greedy, as does a draft tree's mask without its window cut. The acceptance
case: a tiny gemma3 with a 16-token window runs speculative decoding and DSpark over 100 tokens equal to
greedy. docs/models.md is this matrix's table."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import on_test_device
from dspark_helpers import module_cache, one_thread

from bench.tiny_model import embedded_tokenizer
from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import DSparkRound, SpecRound
from decoding.lab.forward_cost import batch_times
from decoding.runner import run
from decoding.runtime import kv_rollback
from decoding.runtime.cost_table import CostTable, auto_cost_path, forward_times
from decoding.runtime.models import LM
from decoding.strategies import beam, tree_verify

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 16
NEW = 20
CONTEXT = 256
LLAMA_LIKE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": CONTEXT}
SLIDING = {"sliding_window": WINDOW}
ARCHS = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": CONTEXT},
    "gpt_neox": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "max_position_embeddings": CONTEXT},
    "opt": {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 32, "max_position_embeddings": CONTEXT},
    "bloom": {"hidden_size": 32, "n_layer": 2, "n_head": 4},
    "falcon": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": CONTEXT},
    "gpt_bigcode": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": CONTEXT},
    "qwen2": dict(LLAMA_LIKE, use_sliding_window=True, max_window_layers=1, **SLIDING),   # full, then sliding
    "qwen3": dict(LLAMA_LIKE, head_dim=8),
    "llama": LLAMA_LIKE,
    "mistral": dict(LLAMA_LIKE, **SLIDING),                                              # every layer sliding
    "phi3": dict(LLAMA_LIKE, **SLIDING),
    "olmo2": LLAMA_LIKE,
    "gemma2": dict(LLAMA_LIKE, head_dim=8, **SLIDING),                                   # local, then global
    "gemma3_text": dict(LLAMA_LIKE, head_dim=8, layer_types=["sliding_attention", "full_attention"], **SLIDING),
    "starcoder2": dict(LLAMA_LIKE, **SLIDING),
}
NO_TREE = {"bloom"}                 # no position ids: a tree's depths cannot be given (docs/models.md)
PROMPT_TEXT = "the cat sat on the mat and the dog sat on the log, " * 3
_built: dict[str, LM] = {}


@pytest.fixture(scope="module")
def tok():
    return embedded_tokenizer()


@pytest.fixture(scope="module", autouse=True)
def _cache(tok, tmp_path_factory):
    """Auto cost tables go to a temporary cache, once the tokenizer was read from the real one."""
    yield from module_cache(tmp_path_factory)


def tiny(arch: str, tok) -> LM:
    """The tiny random `arch` model, built once per module."""
    if arch not in _built:
        import transformers

        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model(arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                                   bos_token_id=None, pad_token_id=tok.eos_token_id, **ARCHS[arch])
        model = on_test_device(transformers.AutoModelForCausalLM.from_config(config).eval())
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.eos_token_id
        _built[arch] = LM(model, tok, name=f"tiny-{arch}")
        seed_cost_table(_built[arch])
    return _built[arch]


def seed_cost_table(lm: LM) -> None:
    """DSpark's defaults read the model's auto cost table: a made-up one in the module's cache spares each
    model the profiling (test_the_cost_profiler_rolls_back_a_sliding_window runs it on a sliding window)."""
    path = auto_cost_path(lm)
    path.parent.mkdir(parents=True, exist_ok=True)
    CostTable(verify_ms=tuple(2.0 + 0.25 * n for n in range(1, 33))).save(path)


def prompt_ids(lm: LM) -> list[int]:
    ids = lm.encode(PROMPT_TEXT, chat_template=False)[:30]
    assert len(ids) == 30
    return ids


def greedy_ids(lm: LM, n: int = NEW) -> list[int]:
    trace = run(lm, prompt_ids(lm), GreedyConfig(max_new_tokens=n))
    assert trace.error is None, trace.error
    return list(trace.output_ids)


def same_as_greedy(lm: LM, config, expected: list[int], **kwargs):
    """Run `config` on the prompt; assert it ran without error and equals greedy token for token."""
    trace = run(lm, prompt_ids(lm), config, **kwargs)
    assert trace.error is None, trace.error
    assert list(trace.output_ids) == expected, f"{config.strategy} differs from greedy"
    return trace


def rolled_back_past_window(trace) -> bool:
    """Some round after the window dropped drafts the target did not accept (speculative: a crop; DSpark: a
    verified node left out of the accepted path), so the rollback of a full sliding window was exercised."""
    for step in trace.steps:
        if step.position < WINDOW:
            continue
        if isinstance(step, SpecRound) and step.kv_cropped_target > 0:
            return True
        if isinstance(step, DSparkRound) and not step.prefill and step.fed_tokens > 1 + len(step.accepted_path):
            return True
    return False


# ------------------------------------------------------------------------------ against transformers' generate
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_beam_and_sampling_match_generate(arch, tok):
    lm = tiny(arch, tok)
    ids = prompt_ids(lm)
    x = torch.tensor([ids], device=lm.device)                                           # (1, T)
    with torch.inference_mode():
        theirs = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW)
    assert greedy_ids(lm) == theirs[0, len(ids):].tolist()
    events = list(beam._decode(lm, ids, BeamConfig(max_new_tokens=8, num_beams=2)))
    with torch.inference_mode():
        theirs = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, num_beams=2,
                                   max_new_tokens=8)
    assert beam.output_ids(events) == theirs[0, len(ids):].tolist()
    assert_sampling_matches_generate(lm, ids, x)


def assert_sampling_matches_generate(lm: LM, ids: list[int], x: torch.Tensor) -> None:
    """generate samples a path (temperature 0.8, top-k 20, top-p 0.9); our sampler, forced along the same
    path, gives every token the log-probability generate's processed scores give it."""
    torch.manual_seed(1)
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=0.8, top_k=20,
                                top_p=0.9, max_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    path = out.sequences[0, len(ids):].tolist()
    config = SampleConfig(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=len(path))
    ours = run(lm, ids, config, forced=path)
    theirs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, path)]
    assert [s.chosen_id for s in ours.steps] == path
    assert [s.chosen_logprob for s in ours.steps] == pytest.approx(theirs, abs=1e-4)


# ------------------------------------------------------------------------------ lossless strategies vs greedy
SPECULATIVE = {"auto": {"draft": "auto"}, "lookup": {"draft": "lookup"}}
DSPARK = {"defaults": {}, "chain": {"select": "chain", "cost_table": None},
          "tree": {"select": "tree", "cost_table": None}}


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_and_dspark_equal_greedy(arch, tok):
    lm = tiny(arch, tok)
    expected = greedy_ids(lm)
    rolled = []
    for kwargs in SPECULATIVE.values():
        rolled.append(same_as_greedy(lm, SpeculativeConfig(max_new_tokens=NEW, **kwargs), expected))
    draft = LM(lm.model, tok, name=f"{lm.name}-draft", lock=lm.lock)        # the model as its own draft
    rolled.append(same_as_greedy(lm, SpeculativeConfig(draft="self", max_new_tokens=NEW), expected, drafter=draft))
    for _name, kwargs in DSPARK.items():
        config = DSparkConfig(max_new_tokens=NEW, **kwargs)
        if arch in NO_TREE and config.select == "tree":
            with pytest.raises(ConfigError, match=rf"^select='tree' is invalid: .*{arch}.*position ids"):
                run(lm, prompt_ids(lm), config)
            continue
        rolled.append(same_as_greedy(lm, config, expected))
    assert any(rolled_back_past_window(t) for t in rolled), "no run rejected a draft past the window"


def test_the_matrix_covers_sliding_hybrid_and_full_caches(tok):
    kinds = {arch: set(kv_rollback.attention_kinds(tiny(arch, tok).model)) for arch in ARCHS}
    assert kinds["mistral"] == kinds["starcoder2"] == kinds["phi3"] == {"sliding_attention"}
    assert kinds["gemma2"] == kinds["gemma3_text"] == kinds["qwen2"] == {"sliding_attention", "full_attention"}
    assert kinds["llama"] == kinds["gpt2"] == {"full_attention"}


# ------------------------------------------------------------------------------ the acceptance case
@pytest.mark.slow
def test_gemma3_with_a_16_token_window_over_100_tokens(tok):
    lm = tiny("gemma3_text", tok)
    expected = greedy_ids(lm, 100)
    traces = [same_as_greedy(lm, config, expected) for config in (
        SpeculativeConfig(draft="lookup", max_new_tokens=100), SpeculativeConfig(max_new_tokens=100),
        DSparkConfig(max_new_tokens=100), DSparkConfig(select="chain", cost_table=None, max_new_tokens=100))]
    assert all(rolled_back_past_window(t) for t in traces)


def test_the_cost_profiler_rolls_back_a_sliding_window(tok):
    """The auto cost table (and the Lab's batch sweep) time forwards after a 32-token prefix, twice the
    window, dropping each again."""
    lm = tiny("mistral", tok)
    timed = dict(forward_times(lm, [1, 4], repeats=2))
    assert list(timed) == [1, 4] and all(len(ms) == 2 for ms in timed.values())
    batched = list(batch_times(lm, [2], repeats=2, prefix_tokens=2 * WINDOW))      # the Lab's batch sweep
    assert len(batched) == 1 and len(batched[0].times_ms) == 2


@pytest.mark.parametrize("arch", ["gemma3_text", "mistral"])
def test_a_short_prompt_crosses_the_window_mid_run(arch, tok):
    """An 8-token prompt: the window fills during the answer, inside a verified block or tree."""
    lm = tiny(arch, tok)
    short = prompt_ids(lm)[:8]
    expected = list(run(lm, short, GreedyConfig(max_new_tokens=30)).output_ids)
    for config in (SpeculativeConfig(draft="lookup", max_new_tokens=30),
                   DSparkConfig(select="tree", cost_table=None, max_new_tokens=30)):
        trace = run(lm, short, config)
        assert trace.error is None and list(trace.output_ids) == expected


# ------------------------------------------------------------------------------ negative controls
def oldest_window(layer, sliding: bool, past_len: int, fed: int, keep: list[int]) -> None:
    """A wrong rollback: drops the rejected drafts but trims a sliding layer to its OLDEST positions."""
    base = layer.keys.shape[-2] - fed
    end = base + len(keep)
    layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
    if sliding:
        layer.keys = layer.keys[..., :layer.sliding_window - 1, :]
        layer.values = layer.values[..., :layer.sliding_window - 1, :]
        layer.cumulative_length = past_len + len(keep)


def test_negative_control_a_wrong_window_breaks_the_identity(tok, monkeypatch):
    lm = tiny("gemma3_text", tok)
    expected = greedy_ids(lm, 40)
    config = SpeculativeConfig(draft="lookup", max_new_tokens=40)
    assert rolled_back_past_window(same_as_greedy(lm, config, expected))     # the right rollback: drafts rejected
    monkeypatch.setattr(kv_rollback, "_roll_back_layer", oldest_window)
    trace = run(lm, prompt_ids(lm), config)
    assert list(trace.output_ids) != expected


def test_negative_control_keeping_the_rejected_drafts_breaks_the_identity(tok, monkeypatch):
    """The wrong rollback keeps every verified position, the rejected drafts too."""
    lm = tiny("gemma3_text", tok)
    expected = greedy_ids(lm, 40)
    config = SpeculativeConfig(draft="lookup", max_new_tokens=40)
    assert rolled_back_past_window(same_as_greedy(lm, config, expected))     # the right rollback: drafts rejected
    real = kv_rollback._roll_back_layer
    monkeypatch.setattr(kv_rollback, "_roll_back_layer",
                        lambda layer, sliding, past_len, fed, keep: real(layer, sliding, past_len, fed,
                                                                         list(range(fed))))
    trace = run(lm, prompt_ids(lm), config)
    assert list(trace.output_ids) != expected


def test_negative_control_a_tree_mask_without_the_window_breaks_the_identity(tok, monkeypatch):
    """The short prompt's tree rounds, with the sliding layers' masks lacking their window cut."""
    lm = tiny("gemma3_text", tok)
    short = prompt_ids(lm)[:8]
    expected = list(run(lm, short, GreedyConfig(max_new_tokens=30)).output_ids)
    real = tree_verify.tree_mask
    monkeypatch.setattr(tree_verify, "tree_mask", lambda parents, past_len, dtype=torch.float32, device=None,
                        window=None, kv_start=0: real(parents, past_len, dtype, device, None, kv_start))
    trace = run(lm, short, DSparkConfig(select="tree", cost_table=None, max_new_tokens=30))
    assert list(trace.output_ids) != expected


# ------------------------------------------------------------------------------ refusals and the docs' table
def test_a_cache_that_cannot_roll_back_is_refused_before_the_run(tok):
    """A chunked-attention layer (llama4's) cannot be rolled back: speculative decoding and DSpark are refused
    before any forward, naming the architecture; greedy still runs."""
    lm = tiny("llama", tok)
    model = lm.model
    saved = getattr(model.config, "layer_types", None)
    model.config.layer_types, model.config.attention_chunk_size = ["chunked_attention", "full_attention"], 8
    try:
        for config in (SpeculativeConfig(draft="lookup", max_new_tokens=4), DSparkConfig(max_new_tokens=4)):
            with pytest.raises(ConfigError, match=rf"^strategy='{config.strategy}' is invalid: cannot run on llama "
                                                  r"models: its chunked_attention layers cannot be rolled back"):
                run(lm, prompt_ids(lm), config)
    finally:
        model.config.layer_types = saved
        del model.config.attention_chunk_size


def models_table(text: str) -> dict[str, list[str]]:
    """docs/models.md's rows: architecture -> its cells after the name."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|(.*)\|$", text, flags=re.M)
    return {arch: [cell.strip() for cell in cells.split("|")] for arch, cells in rows}


def table_mismatches(text: str, tok) -> list[str]:
    """Where docs/models.md's table says other than this module runs: its architectures and their order, the
    attention layers each model has, and what runs (every strategy; a tree refused on NO_TREE)."""
    table = models_table(text)
    wrong = [] if list(table) == list(ARCHS) else [f"rows {list(table)}"]
    for arch, (layers, plain, speculative, dspark) in table.items():
        kinds = kv_rollback.attention_kinds(tiny(arch, tok).model)
        said = {"full_attention": "full" in layers, "sliding_attention": "sliding" in layers}
        if said != {kind: kind in kinds for kind in said}:
            wrong.append(f"{arch}: layers {layers!r}, the model has {sorted(set(kinds))}")
        dspark_runs = "chain only" if arch in NO_TREE else "yes"
        if [plain, speculative, dspark.split(":")[0]] != ["yes", "yes", dspark_runs]:
            wrong.append(f"{arch}: {plain!r}, {speculative!r}, {dspark!r}")
    return wrong


def test_docs_models_table_says_what_the_matrix_runs(tok):
    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert table_mismatches(text, tok) == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/models.md" in readme and all(f"`{arch}`" in readme for arch in ARCHS)
    bloom_tree = text.replace("| yes | yes | chain only", "| yes | yes | yes")
    mistral_full = text.replace("| `mistral` | sliding window |", "| `mistral` | full |")
    assert len(table_mismatches(bloom_tree, tok)) == len(table_mismatches(mistral_full, tok)) == 1   # controls
