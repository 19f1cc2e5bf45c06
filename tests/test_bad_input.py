"""The bad-input matrix (README, "Bad input"): every case gives one line that names the parameter and
the bad value. The CLI exits with status 2 and prints one `error: ...` line, no traceback; the app
shows an st.error; a run that had started keeps its trace so far. Each case id is a row of the README
table, and each place a case applies to (CLI, engine, app) is a test here."""
from __future__ import annotations

import json
import os
import re
import shutil
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import app_support as app_tests
import pytest
import torch
from app_support import run_to_end
from cli_support import NOT_UTF8, cli_main, one_line
from dspark_helpers import chain_config, one_thread, random_drafter, varied_llama
from md_helpers import shown
from weights_support import BAD_HEADER, nan_copy, rewrite
from word_models import PROMPT, build_nan_model_dir, build_word_model_dir, word_tokenizer

from decoding.core import trace as trace_mod
from decoding.core.config import BeamConfig, DSparkConfig, GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import Trace, TraceFormatError, from_json, to_dict, to_json, without_timings
from decoding.drafters.draft_model import check_compatible
from decoding.drafters.factory import load_draft
from decoding.drafters.shallow import build_shallow, save_shallow
from decoding.runner import run
from decoding.runtime.cost_table import MAX_COST_BYTES, MAX_COST_ENTRIES, CostTable
from decoding.runtime.models import LM, ModelSpec, load, resolve_device
from decoding.train.common import check_outputs
from ui.widgets import keys as ui_keys
from ui.widgets.advanced import MAX_COST_LINK_CHARS
from ui.widgets.params import LINK_PATHS

ROOT = Path(__file__).resolve().parents[1]
_threads = pytest.fixture(scope="module", autouse=True)(one_thread)
OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB (simulated)"


# ------------------------------------------------------------------------------ patches

def no_warm_up(mp: pytest.MonkeyPatch) -> None:
    """Switch off the load-time warm-up forwards (LM.warm_up), so that a patch's `calls_ok` counts the
    run's own forwards whether the model is loaded before or after the patch."""
    from decoding.runtime.models import LM

    mp.setattr(LM, "warm_up", lambda self, ids=(): self)


def oom_after(calls_ok: int) -> Callable:
    """A patch: every llama forward after the first `calls_ok` raises CUDA's OutOfMemoryError."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        from transformers import LlamaForCausalLM

        no_warm_up(mp)

        original, calls = LlamaForCausalLM.forward, [0]

        def forward(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] > calls_ok:
                raise torch.cuda.OutOfMemoryError(OOM_TEXT)
            return original(self, *args, **kwargs)

        mp.setattr(LlamaForCausalLM, "forward", forward)
    return patch


def bad_logits_after(calls_ok: int, value: float, entries=slice(None), only=None) -> Callable:
    """A patch: llama forwards after the first `calls_ok` (of the model `only`, if given) return
    logits with `value` written at `entries` of the vocabulary."""
    def patch(mp: pytest.MonkeyPatch) -> None:
        from transformers import LlamaForCausalLM

        no_warm_up(mp)
        original, calls = LlamaForCausalLM.forward, [0]

        def forward(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            if only is None or self is only:
                calls[0] += 1
                if calls[0] > calls_ok:
                    out.logits[..., entries] = value
            return out

        mp.setattr(LlamaForCausalLM, "forward", forward)
    return patch


def no_model_load(mp: pytest.MonkeyPatch) -> None:
    """A patch: loading a model fails the test (a trainer must refuse its --out before any work)."""
    import decoding.runtime.models as models

    def load_(spec):
        raise AssertionError(f"the model was loaded ({spec.name}) before the bad input was refused")

    mp.setattr(models, "load", load_)


def oom_on_move(mp: pytest.MonkeyPatch) -> None:
    """A patch: the loaded model runs out of memory when moved to its device (a model too large for
    the GPU); everything before the move is the real loader."""
    import decoding.runtime.models as models

    real_load_any = models._load_any

    class TooLarge:
        def __init__(self, model):
            self.model = model

        def to(self, device):
            raise torch.cuda.OutOfMemoryError(OOM_TEXT)

    def load_any(spec, dtype):
        model, tok = real_load_any(spec, dtype)
        return TooLarge(model), tok

    mp.setattr(models, "_load_any", load_any)


def chunked_llama() -> LM:
    """A tiny llama whose first layer is chunked attention (as llama4's): its cache cannot be rolled back."""
    lm = varied_llama(seed=5)
    lm.model.config.layer_types, lm.model.config.attention_chunk_size = ["chunked_attention", "full_attention"], 8
    lm.name = "chunked"
    return lm


def flash_llama() -> LM:
    """A tiny llama set to an attention implementation that takes no custom 4D mask (flash attention's)."""
    lm = varied_llama(seed=6)
    lm.model.config._attn_implementation = "flash_attention_2"
    return lm


def static_cache_roll_back(lm: LM):
    """roll_back (decoding.runtime.kv_rollback) on transformers' own StaticCache, whose layers it cannot crop."""
    from transformers import StaticCache

    from decoding.runtime.kv_rollback import roll_back

    return roll_back(StaticCache(config=lm.model.config, max_cache_len=16), 0)


def build_bloom_dir(target: Path) -> Path:
    """A tiny random bloom (ALiBi: its forward takes no position ids) with the word tokenizer."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)).save_pretrained(target)
    word_tokenizer().save_pretrained(target)
    return target


# ------------------------------------------------------------------------------ the cases

@dataclass(frozen=True)
class Case:
    """One row of the matrix. `pattern` is searched in the message (for the CLI, in its one line).
    cli: flags after `run` (on the word model unless they name another); app: URL query parameters
    (on the tiny app model unless they name another), then `action`; engine: fn(env) that raises the
    error or returns a trace with .error; upload: fn(env) -> trace file bytes (engine from_json and the
    app's Traces page). `{name}` in cli/app values is a path from env.paths. patch: fn(monkeypatch).
    sidebar: fn(at, env) that sets sidebar widgets after the URL's values (a file to upload, a value a
    link does not carry). warning: the app's line is a warning box (a link value it ignores), not an error."""

    id: str
    pattern: str
    cli: list[str] | None = None
    app: dict | None = None
    action: str | None = None                 # app: None | "step" | "run_end"
    engine: Callable | None = None
    upload: Callable | None = None
    patch: Callable | None = None
    needs_no_cuda: bool = False
    sidebar: Callable | None = None
    warning: bool = False
    train: list[str] | None = None           # CLI: flags after `train` (instead of `run ...`)

    @property
    def where(self) -> list[str]:
        places = [("CLI", self.cli is not None or self.train is not None),
                  ("engine", self.engine is not None or self.upload is not None),
                  ("app", self.app is not None or self.upload is not None)]
        return [name for name, ok in places if ok]


def upload_cost(at, path: Path):
    """Choose a cost-table file in the sidebar's DSpark Advanced expander and upload `path`."""
    key = "w.param.dspark.cost_table"
    at.radio(key=key).set_value("file").run()
    at.file_uploader(key=key + ".file").set_value((path.name, path.read_bytes(), "application/json")).run()
    return at


def dspark_run(e, cost: str) -> Trace:
    return run(e.lm, [1, 2, 3], chain_config(gamma=3, cost_table=cost), drafter=e.drafter)


def greedy(e, n: int = 4, **kw) -> Trace:
    return run(e.lm, [1, 2, 3], GreedyConfig(max_new_tokens=n), **kw)


def traced(e, edit: Callable[[dict], None], strategy: str = "sample") -> bytes:
    """A real trace of the word model under `strategy` (env.traces) as JSON, changed by `edit`."""
    data = json.loads(e.traces[strategy])
    edit(data)
    return json.dumps(data).encode()


def empty_output_with_text(data: dict) -> None:
    """A trace with no steps and no output, yet a text."""
    data.update(steps=[], output_ids=[], text="hello")
    data["stats"].update(new_tokens=0, target_forwards=0)


def flip_last_verdict(data: dict) -> None:
    """The first round's second draft given a verdict its round's counts contradict."""
    draft = data["steps"][0]["drafts"][1]
    draft["verdict"] = "accepted" if draft["verdict"] == "not_reached" else "not_reached"


def copy_drafting_to_round_1(data: dict) -> None:
    """The prefill round's `drafting` (the run's sources) also on the first drafting round."""
    assert data["steps"][0]["drafting"]
    data["steps"][1]["drafting"] = data["steps"][0]["drafting"]


def steps_of(e, strategy: str) -> list[dict]:
    return json.loads(e.traces[strategy])["steps"]


SPEC, DSPARK, SAMPLE = ["--strategy", "speculative"], ["--strategy", "dspark"], ["--strategy", "sample"]
HUGE_MEMORY = "cpu=1" + "0" * 40 + "GiB"                   # over 2**63 - 1 bytes

CASES = [
    # ---- prompt and length
    Case("prompt-empty", r"prompt='' is invalid: must not be empty", cli=["--prompt", ""],
         app={"prompt": ""}, engine=lambda e: e.lm.encode("")),
    Case("prompt-whitespace", r"prompt='   ' is invalid: must not be empty", cli=["--prompt", "   "],
         app={"prompt": "   "}, engine=lambda e: e.lm.encode("   ", chat_template=False)),
    Case("prompt-not-utf8", r"prompt='w1 \\udcff w2' is invalid: is not UTF-8 text \(", cli=["--prompt", NOT_UTF8],
         engine=lambda e: e.lm.encode(NOT_UTF8)),
    Case("prompt-over-context", r"prompt='<\d+ tokens>' is invalid: is longer than the model's context of \d+ tokens",
         cli=["--prompt", "w1 " * 300, "--no-chat-template"], app={"prompt": "word " * 1100, "chat": "0"},
         engine=lambda e: run(e.lm, [1] * 300, GreedyConfig())),
    Case("max-new-tokens-zero", r"max_new_tokens=0 is invalid: must be an integer >= 1",
         cli=["--max-new-tokens", "0"], app={"max_new": "0"}, engine=lambda e: GreedyConfig(max_new_tokens=0)),
    Case("max-new-tokens-negative", r"max_new_tokens=-5 is invalid", cli=["--max-new-tokens", "-5"],
         app={"max_new": "-5"}, engine=lambda e: SampleConfig(max_new_tokens=-5)),
    Case("max-new-tokens-over-context", r"max_new_tokens=\d+ is invalid: goes beyond the model's context of \d+ "
         r"tokens: the prompt has \d+, so at most \d+ new tokens fit", cli=["--max-new-tokens", "300"],
         app={"max_new": "2000"}, engine=lambda e: greedy(e, 300)),
    # ---- sampling parameters
    Case("temperature-negative", r"temperature=-0\.5 is invalid", cli=SAMPLE + ["--temperature", "-0.5"],
         app={"strategy": "sample", "temperature": "-0.5"}, engine=lambda e: SampleConfig(temperature=-0.5)),
    Case("temperature-not-finite", r"temperature=(inf|nan) is invalid: must be 0 \(greedy\) or a finite number",
         cli=SAMPLE + ["--temperature", "inf"], engine=lambda e: SampleConfig(temperature=float("nan"))),
    Case("temperature-too-small", r"temperature=1e-09 is invalid: must be 0 \(greedy\) or a finite number >= 1e-06",
         cli=SAMPLE + ["--temperature", "1e-9"], app={"strategy": "sample", "temperature": "1e-9"},
         engine=lambda e: SpeculativeConfig(temperature=1e-9)),
    Case("temperature-zero-for-sampling", r"temperature=0(\.0)? is invalid: must be > 0 for sampling",
         cli=SAMPLE + ["--temperature", "0"], app={"strategy": "sample", "temperature": "0"},
         engine=lambda e: SampleConfig(temperature=0)),
    Case("top-k-negative", r"top_k=-1 is invalid: must be an integer >= 0", cli=SAMPLE + ["--top-k", "-1"],
         app={"strategy": "sample", "top_k": "-1"}, engine=lambda e: SampleConfig(top_k=-1)),
    Case("top-p-zero", r"top_p=0(\.0)? is invalid: must be in \(0, 1\]", cli=SAMPLE + ["--top-p", "0"],
         app={"strategy": "sample", "top_p": "0"}, engine=lambda e: SampleConfig(top_p=0.0)),
    Case("top-p-over-one", r"top_p=1\.5 is invalid: must be in \(0, 1\]", cli=SAMPLE + ["--top-p", "1.5"],
         app={"strategy": "sample", "top_p": "1.5"}, engine=lambda e: DSparkConfig(top_p=1.5)),
    Case("min-p-over-one", r"min_p=2(\.0)? is invalid: must be in \[0, 1\]", cli=SAMPLE + ["--min-p", "2"],
         app={"strategy": "sample", "min_p": "2"}, engine=lambda e: SampleConfig(min_p=2.0)),
    Case("top-n-out-of-range", r"top_n=(0|101) is invalid: must be an integer in \[1, 100\]", cli=["--top-n", "0"],
         app={"top_n": "101"}, engine=lambda e: GreedyConfig(top_n=101)),
    Case("seed-negative", r"seed=-1 is invalid", cli=["--seed", "-1"], app={"seed": "-1"},
         engine=lambda e: SampleConfig(seed=-1)),
    Case("seed-too-large", r"seed=18446744073709551616 is invalid: must be an integer in \[0, \d+\]",
         cli=["--seed", str(2**64)], engine=lambda e: GreedyConfig(seed=2**64)),
    Case("num-beams-out-of-range", r"num_beams=(0|33) is invalid: must be an integer in \[1, 32\]",
         cli=["--strategy", "beam", "--num-beams", "0"], app={"strategy": "beam", "num_beams": "33"},
         engine=lambda e: BeamConfig(num_beams=0)),
    Case("length-penalty-out-of-range", r"length_penalty=11(\.0)? is invalid: must be a number in \[-10, 10\]",
         cli=["--strategy", "beam", "--length-penalty", "11"], app={"strategy": "beam", "length_penalty": "11"},
         engine=lambda e: BeamConfig(length_penalty=11.0)),
    # ---- speculative and dspark parameters
    Case("gamma-out-of-range", r"gamma=(0|33) is invalid: must be an integer in \[1, 32\]",
         cli=SPEC + ["--gamma", "0"], app={"strategy": "speculative", "gamma": "33"},
         engine=lambda e: SpeculativeConfig(gamma=0)),
    Case("gamma-dspark-out-of-range", r"gamma=17 is invalid: must be an integer in \[1, 16\]",
         cli=DSPARK + ["--gamma", "17"], app={"strategy": "dspark", "gamma": "17"},
         engine=lambda e: DSparkConfig(gamma=17)),
    Case("gamma-over-drafter", r"gamma=6 is invalid: must be <= the gamma_max \(4\) of (drafter '[^']+'|the drafter "
         r"passed in)$",
         cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "6"],
         engine=lambda e: run(e.lm, [1, 2, 3], chain_config(gamma=6), drafter=e.drafter)),
    Case("gamma-max-below-gamma", r"gamma_max=3 is invalid: must be 0 \(off\) or an integer in \[gamma, 32\]",
         cli=SPEC + ["--gamma", "5", "--gamma-max", "3"], app={"strategy": "speculative", "gamma_max": "3"},
         engine=lambda e: SpeculativeConfig(gamma=5, gamma_max=3)),
    Case("gamma-policy-unknown", r"gamma_policy='x' is invalid: choose one of fixed, heuristic, confidence, cost",
         app={"strategy": "speculative", "gamma_policy": "x"}, engine=lambda e: SpeculativeConfig(gamma_policy="x")),
    Case("confidence-threshold-out-of-range", r"confidence_threshold=1\.5 is invalid: must be in \[0, 1\]",
         cli=SPEC + ["--confidence-threshold", "1.5"], app={"strategy": "speculative", "confidence_threshold": "1.5"},
         engine=lambda e: SpeculativeConfig(confidence_threshold=1.5)),
    Case("lookup-max-ngram-zero", r"lookup_max_ngram=0 is invalid", cli=SPEC + ["--lookup-max-ngram", "0"],
         app={"strategy": "speculative", "lookup_max_ngram": "0"},
         engine=lambda e: SpeculativeConfig(lookup_max_ngram=0)),
    Case("top-k-candidates-zero", r"top_k_candidates=0 is invalid: must be an integer in \[1, 64\]",
         cli=DSPARK + ["--top-k-candidates", "0"], app={"strategy": "dspark", "top_k_candidates": "0"},
         engine=lambda e: DSparkConfig(top_k_candidates=0)),
    Case("budget-out-of-range", r"budget=(0|257) is invalid: must be an integer in \[1, 256\]",
         cli=DSPARK + ["--select", "tree", "--budget", "0"], app={"strategy": "dspark", "budget": "257"},
         engine=lambda e: DSparkConfig(select="tree", budget=257)),
    Case("lossy-threshold-out-of-range", r"lossy_threshold=1\.5 is invalid: must be a number in \(0, 1\]",
         cli=DSPARK + ["--temperature", "1", "--lossy-threshold", "1.5"],
         app={"strategy": "dspark", "temperature": "1", "lossy_threshold": "1.5"},
         engine=lambda e: DSparkConfig(temperature=1.0, lossy_threshold=1.5)),
    Case("lossy-threshold-not-a-number", r"lossy_threshold='abc' is invalid: must be a number in \(0, 1\]",
         app={"strategy": "dspark", "temperature": "1", "lossy_threshold": "abc"},
         engine=lambda e: DSparkConfig(temperature=1.0, lossy_threshold="abc")),
    Case("lossy-threshold-at-temperature-0", r"lossy_threshold=0\.5 is invalid: applies to temperature > 0 only",
         cli=DSPARK + ["--lossy-threshold", "0.5"], app={"strategy": "dspark", "lossy_threshold": "0.5"},
         engine=lambda e: DSparkConfig(lossy_threshold=0.5)),
    Case("cost-table-missing", r"cost_table='[^']*nope\.json' is invalid: could not be read",
         cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--cost-table", "{tmp}/nope.json"],
         engine=lambda e: dspark_run(e, str(e.tmp / "nope.json"))),
    Case("cost-table-not-json", r"cost_table='[^']*cost\.json' is invalid: could not be read \(Expecting value",
         cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--cost-table", "{badcost}"],
         app={"strategy": "dspark"}, sidebar=lambda at, e: upload_cost(at, e.paths["badcost"]),
         engine=lambda e: dspark_run(e, str(e.paths["badcost"]))),
    Case("cost-table-over-size", rf"cost_table='[^']*huge\.json' is invalid: is over {MAX_COST_BYTES} bytes$",
         cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--cost-table", "{hugecost}"],
         app={"strategy": "dspark"}, sidebar=lambda at, e: upload_cost(at, e.paths["hugecost"]),
         engine=lambda e: dspark_run(e, str(e.paths["hugecost"]))),
    Case("cost-table-nested-too-deeply", r"cost_table='[^']*deep\.json' is invalid: could not be read \(JSON nested "
         r"too deeply\)", cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--cost-table", "{deepcost}"],
         app={"strategy": "dspark"}, sidebar=lambda at, e: upload_cost(at, e.paths["deepcost"]),
         engine=lambda e: dspark_run(e, str(e.paths["deepcost"]))),
    Case("cost-table-too-many-entries", rf"cost_table='[^']*long\.json' is invalid: needs 1 to {MAX_COST_ENTRIES} "
         r"entries$", cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--cost-table", "{longcost}"],
         app={"strategy": "dspark"}, sidebar=lambda at, e: upload_cost(at, e.paths["longcost"]),
         engine=lambda e: dspark_run(e, str(e.paths["longcost"]))),
    Case("cost-table-too-short",
         r"cost_table='[^']*short\.json' is invalid: covers 2 tokens; this run verifies up to 4",
         cli=DSPARK + ["--drafter", "{drafter}", "--gamma", "3", "--select", "chain", "--cost-table", "{shortcost}"],
         app={"strategy": "dspark", "gamma": "3", "select": "chain"},
         sidebar=lambda at, e: upload_cost(at, e.paths["shortcost"]),
         engine=lambda e: dspark_run(e, str(e.paths["shortcost"]))),
    Case("cost-table-without-cost-policy", r"cost_table='auto' is invalid: is used by gamma_policy 'cost' only "
         r"\(this run's is 'fixed'\)", cli=SPEC + ["--cost-table", "auto"],
         app={"strategy": "speculative", "cost_table": "auto"},
         engine=lambda e: SpeculativeConfig(cost_table="auto")),
    Case("cost-table-link-malformed", r"cost_table='fast' is invalid: give 'auto', 'none' or the verify milliseconds",
         app={"strategy": "dspark", "cost_table": "fast"}),
    Case("cost-table-link-too-long", r"^Ignored unreadable link parameter\(s\): cost_table$", warning=True,
         app={"strategy": "dspark", "cost_table": ",".join(["1.0"] * (MAX_COST_LINK_CHARS // 4 + 1))}),
    # ---- models, drafts and drafters
    Case("draft-other-vocabulary", r"draft='[^']*' is invalid: has a vocabulary of \d+ tokens, the target has \d+",
         cli=SPEC + ["--draft", "{word80}"], app={"strategy": "speculative", "draft": "{word}"},
         engine=lambda e: check_compatible(load(ModelSpec(str(e.paths["word80"]))), e.lm)),
    Case("draft-other-tokenizer", r"draft='[^']*vword' is invalid: uses a different tokenizer from the target's",
         cli=SPEC + ["--draft", "{vword}"], engine=lambda e: load_draft(str(e.paths["vword"]), e.lm)),
    Case("draft-missing", r"draft='[^']*no-draft' is invalid: no such file or directory",
         cli=SPEC + ["--draft", "{tmp}/no-draft"],
         app={"strategy": "speculative", "draft": "{tmp}/no-draft"},
         engine=lambda e: load_draft(str(e.tmp / "no-draft"), e.lm)),
    Case("draft-not-weights", r"draft='shallow:[^']*notes\.txt' is invalid: could not be read \(",
         cli=SPEC + ["--draft", "shallow:{notes}"], app={"strategy": "speculative", "draft": "shallow:{notes}"},
         engine=lambda e: load_draft(f"shallow:{e.paths['notes']}", e.lm)),
    Case("draft-weights-damaged", r"draft='shallow:[^']*s\.safetensors' is invalid: could not be read "
         r"\('head\.vocab_ids' is missing\)", cli=SPEC + ["--draft", "shallow:{badshallow}"],
         engine=lambda e: load_draft(f"shallow:{e.paths['badshallow']}", e.lm)),
    Case("feature-weights-missing", r"draft='feature:[^']*no-feature\.safetensors' is invalid: has no feature-drafter "
         r"weights file: train one with `python -m decoding train feature`",
         cli=SPEC + ["--draft", "feature:{tmp}/no-feature.safetensors"],
         app={"strategy": "speculative", "draft": "feature:{tmp}/no-feature.safetensors"},
         engine=lambda e: load_draft(f"feature:{e.tmp}/no-feature.safetensors", e.lm)),
    Case("draft-lookup-without-model", r"draft='lookup\+' is invalid: give a draft model after 'lookup\+'",
         cli=SPEC + ["--draft", "lookup+"], app={"strategy": "speculative", "draft": "lookup+"},
         engine=lambda e: SpeculativeConfig(draft="lookup+")),
    Case("draft-lookup-then-missing", r"draft='[^']*no-draft' is invalid: no such file or directory",
         cli=SPEC + ["--draft", "lookup+{tmp}/no-draft"],
         app={"strategy": "speculative", "draft": "lookup+{tmp}/no-draft"},
         engine=lambda e: load_draft(SpeculativeConfig(draft=f"lookup+{e.tmp}/no-draft").draft_model, e.lm)),
    Case("draft-part-of-dspark", r"draft='parallel' is invalid: the parallel drafter drafts DSpark's lattice, not "
         r"speculative decoding's chain$", cli=SPEC + ["--draft", "parallel"],
         app={"strategy": "speculative", "draft": "parallel"}, engine=lambda e: SpeculativeConfig(draft="parallel")),
    Case("drafter-part-of-speculative", r"drafter='lookup\+recycling' is invalid: prompt lookup is DSpark's "
         r"lookup_max_ngram, not a drafter part$", cli=DSPARK + ["--drafter", "lookup+recycling"],
         app={"strategy": "dspark", "drafter": "lookup+recycling"},
         engine=lambda e: DSparkConfig(drafter="lookup+recycling")),
    Case("dspark-tree-without-positions", r"select='tree' is invalid: cannot verify a draft tree on bloom models: it "
         r"takes no position ids \(keys are placed by their order, as with ALiBi\), so a tree's nodes cannot be given "
         r"their depths; use select 'chain'$", cli=DSPARK + ["--model", "{bloom}", "--cost-table", "none"],
         engine=lambda e: run(load(ModelSpec(str(e.paths["bloom"]))), [1, 2, 3], DSparkConfig(max_new_tokens=4))),
    Case("dspark-tree-attention-ignores-masks", r"attn_implementation='flash_attention_2' is invalid: tree "
         r"verification needs one of sdpa, eager \(custom 4D masks\)$",
         engine=lambda e: run(flash_llama(), [1, 2, 3], DSparkConfig(max_new_tokens=4))),
    Case("strategy-cache-cannot-roll-back", r"strategy='speculative' is invalid: cannot run on llama models: its "
         r"chunked_attention layers cannot be rolled back to a shorter context$",
         engine=lambda e: run(chunked_llama(), [1, 2, 3], SpeculativeConfig(draft="lookup", max_new_tokens=4))),
    Case("draft-cache-cannot-roll-back", r"draft='chunked' is invalid: cannot draft on llama models: its "
         r"chunked_attention layers cannot be rolled back to a shorter context$",
         engine=lambda e: run(varied_llama(), [1, 2, 3], SpeculativeConfig(draft="chunked", max_new_tokens=4),
                              drafter=chunked_llama())),
    Case("cache-layer-cannot-roll-back", r"cache='StaticLayer' is invalid: cannot be rolled back \(full-attention and "
         r"sliding-window DynamicCache layers, or the fast path's static cache, can\)$",
         engine=lambda e: static_cache_roll_back(e.lm)),
    Case("drafter-wrong-kind", r"drafter='LM' is invalid: is not a DSpark drafter: give a source, a parallel "
         r"drafter or a feature head$",
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(max_new_tokens=2), drafter=e.lm)),
    Case("drafter-missing", r"drafter='[^']*no-drafter\.safetensors' is invalid: no drafter weights there",
         cli=DSPARK + ["--drafter", "{tmp}/no-drafter.safetensors"],
         app={"strategy": "dspark", "drafter": "{tmp}/no-drafter.safetensors"}, action="step",
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.tmp / "no-drafter.safetensors")))),
    Case("drafter-not-weights", r"drafter='[^']*notes\.txt' is invalid: could not be read",
         cli=DSPARK + ["--drafter", "{notes}"],
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["notes"])))),
    Case("drafter-weights-damaged", r"drafter='[^']*p\.safetensors' is invalid: could not be read \(gamma_max=999 ",
         cli=DSPARK + ["--drafter", "{baddrafter}"],
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["baddrafter"])))),
    Case("drafter-weights-nan", r"drafter='[^']*nan-p\.safetensors' is invalid: holds NaN or infinite weights \(\d+ in "
         r"'w2'\); train it again$", cli=DSPARK + ["--drafter", "{nandrafter}"],
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["nandrafter"])))),
    Case("drafter-other-model", r"drafter='feature' is invalid: was trained for another model \(hidden size 576; "
         r"this one has 32\)", cli=DSPARK + ["--drafter", "feature"],
         app={"strategy": "dspark", "drafter": "feature"}, action="step",
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter="feature"))),
    Case("drafter-other-weights", r"drafter='(feature|parallel):[^']*other-(f|p)\.safetensors' is invalid: was trained "
         r"for another model \(its fingerprint: same architecture and tokenizer, other weights\); train one for this "
         r"model \(docs/drafters\.md \"Your model\"\)$", cli=DSPARK + ["--drafter", "feature:{otherfeature}"],
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=f"parallel:{e.paths['otherparallel']}"))),
    Case("draft-other-weights", r"draft='feature:[^']*other-f\.safetensors' is invalid: was trained for another "
         r"model \(its fingerprint: same architecture and tokenizer, other weights\); train one for this model",
         cli=SPEC + ["--draft", "feature:{otherfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['otherfeature']}", e.lm)),
    Case("draft-feature-other-shape", r"draft='feature:[^']*old-f\.safetensors' is invalid: was trained for another "
         r"model \(hidden size 16; this one has 32\)$", cli=SPEC + ["--draft", "lookup+feature:{oldfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['oldfeature']}", e.lm)),
    Case("drafter-header-over-file", r"drafter='[^']*big-p\.safetensors' is invalid: could not be read \(its header "
         r"does not match its tensors: 'trunk_b' is \(65536\) by the header, \(32\) in the file\)$",
         cli=DSPARK + ["--drafter", "{bigdrafter}"], app={"strategy": "dspark", "drafter": "{bigdrafter}"},
         action="step", engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["bigdrafter"])))),
    Case("draft-header-over-file", r"draft='feature:[^']*big-f\.safetensors' is invalid: could not be read \(its "
         r"header does not match its tensors: 'blocks\.0\.down\.bias' is \(16384\) by the header, \(8\) in the "
         r"file\)$", cli=SPEC + ["--draft", "feature:{bigfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['bigfeature']}", e.lm)),
    Case("draft-header-asks-for-blocks", r"draft='feature:[^']*blocks-f\.safetensors' is invalid: could not be read "
         r"\(its header asks for 1000000000 blocks; the file holds \d+ tensors\)$",
         cli=SPEC + ["--draft", "feature:{blocksfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['blocksfeature']}", e.lm)),
    Case("drafter-metadata-not-an-object", r"drafter='[^']*list-p\.safetensors' is invalid: could not be read \(its "
         r"'meta' is a JSON list, not an object\)$", cli=DSPARK + ["--drafter", "{listdrafter}"],
         app={"strategy": "dspark", "drafter": "{listdrafter}"}, action="step",
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["listdrafter"])))),
    Case("draft-metadata-not-an-object", r"draft='feature:[^']*list-f\.safetensors' is invalid: could not be read "
         r"\(its 'meta' is a JSON list, not an object\)$", cli=SPEC + ["--draft", "feature:{listfeature}"],
         app={"strategy": "speculative", "draft": "feature:{listfeature}"},
         engine=lambda e: load_draft(f"feature:{e.paths['listfeature']}", e.lm)),
    Case("drafter-metadata-not-json", r"drafter='[^']*badjson-p\.safetensors' is invalid: could not be read \(its "
         r"'meta' is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 \(char 1\)\)$",
         cli=DSPARK + ["--drafter", "{badjsondrafter}"],
         engine=lambda e: run(e.lm, [1, 2, 3], DSparkConfig(drafter=str(e.paths["badjsondrafter"])))),
    Case("draft-vocab-ids-negative", r"draft='feature:[^']*neg-f\.safetensors' is invalid: could not be read "
         r"\(vocab_ids='<8 ids>' is invalid: must be distinct token ids >= 0\)$",
         cli=SPEC + ["--draft", "feature:{negfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['negfeature']}", e.lm)),
    Case("draft-vocab-ids-repeated", r"(draft|drafter)='feature:[^']*dup-f\.safetensors' is invalid: could not be read "
         r"\(vocab_ids='<8 ids>' is invalid: must be distinct token ids >= 0\)$",
         cli=DSPARK + ["--drafter", "feature:{dupfeature}"],
         engine=lambda e: load_draft(f"feature:{e.paths['dupfeature']}", e.lm)),
    Case("model-unknown-offline", r"model='no-such-org/no-such-model' is invalid: was not found in a local "
         r"directory or the local HF cache", cli=["--model", "no-such-org/no-such-model"],
         app={"model": "no-such-org/no-such-model"}, engine=lambda e: load(ModelSpec("no-such-org/no-such-model"))),
    Case("model-path-missing", r"model='[^']*no-model' is invalid: no such file or directory",
         cli=["--model", "{tmp}/no-model"], app={"model": "{tmp}/no-model"},
         engine=lambda e: load(ModelSpec(str(e.tmp / "no-model")))),
    Case("model-dir-without-weights", r"model='[^']*empty' is invalid: directory has no weights",
         cli=["--model", "{empty}"], app={"model": "{empty}"}, engine=lambda e: load(ModelSpec(str(e.paths["empty"])))),
    Case("model-config-broken", r"model='[^']*badcfg' is invalid: its config\.json could not be read \(",
         cli=["--model", "{badcfg}"], app={"model": "{badcfg}"},
         engine=lambda e: load(ModelSpec(str(e.paths["badcfg"])))),
    Case("model-config-missing", r"model='[^']*nocfg' is invalid: directory has no config\.json",
         cli=["--model", "{nocfg}"], engine=lambda e: load(ModelSpec(str(e.paths["nocfg"])))),
    Case("model-custom-code", r"model='[^']*custom' is invalid: its architecture 'xmodel' is code in the model's "
         r"folder \(auto_map\), which is not run: pass --trust-remote-code \(trust_remote_code=True\) for a model "
         r"you trust$", cli=["--model", "{custom}"], app={"model": "{custom}"},
         engine=lambda e: load(ModelSpec(str(e.paths["custom"])))),
    Case("model-not-a-directory", r"model='[^']*notes\.txt' is invalid: must be a directory or a \.gguf file",
         cli=["--model", "{notes}"], app={"model": "{notes}"}, engine=lambda e: load(ModelSpec(str(e.paths["notes"])))),
    Case("gguf-bad-magic", r"gguf_file='[^']*broken\.gguf' is invalid: is not a GGUF file",
         cli=["--model", "{broken}"], app={"model": "{broken}"},
         engine=lambda e: load(ModelSpec(str(e.paths["broken"])))),
    Case("gguf-corrupt", r"gguf_file='[^']*corrupt\.gguf' is invalid: could not be loaded",
         cli=["--model", "{corrupt}"], engine=lambda e: load(ModelSpec(str(e.paths["corrupt"])))),
    Case("gguf-file-missing", r"gguf_file='nope\.gguf' is invalid: no such file", cli=["--gguf-file", "nope.gguf"],
         app={"gguf_file": "nope.gguf"}, engine=lambda e: load(ModelSpec(str(e.paths["word"]), gguf_file="nope.gguf"))),
    Case("device-map-unknown", r"device_map='everywhere' is invalid: choose one of auto, balanced",
         app={"device_map": "everywhere"}, engine=lambda e: ModelSpec(str(e.paths["word"]), device_map="everywhere")),
    Case("max-memory-malformed", r"max_memory='cpu=lots' is invalid: 'lots' is not a size",
         cli=["--device-map", "auto", "--max-memory", "cpu=lots"], app={"device_map": "auto", "max_memory": "cpu=lots"},
         engine=lambda e: ModelSpec(str(e.paths["word"]), device_map="auto", max_memory="cpu=lots")),
    Case("max-memory-too-large", r"max_memory='cpu=10+GiB' is invalid: '10+GiB' is too large \(at most "
         r"9223372036854775807 bytes\)", cli=["--device-map", "auto", "--max-memory", HUGE_MEMORY],
         app={"device_map": "auto", "max_memory": HUGE_MEMORY},
         engine=lambda e: ModelSpec(str(e.paths["word"]), device_map="auto", max_memory=HUGE_MEMORY)),
    Case("offload-folder-without-device-map", r"offload_folder='[^']*off' is invalid: applies only with device_map",
         cli=["--offload-folder", "{tmp}/off"], app={},
         sidebar=lambda at, e: at.text_input(key="w.offload_folder").set_value(str(e.tmp / "off")).run(),
         engine=lambda e: ModelSpec(str(e.paths["word"]), offload_folder=str(e.tmp / "off"))),
    Case("device-unavailable", r"device='cuda' is invalid: CUDA is not available", cli=["--device", "cuda"],
         app={"device": "cuda"}, engine=lambda e: resolve_device("cuda"), needs_no_cuda=True),
    Case("fast-path-off-cuda", r"fast_path=True is invalid: needs a CUDA device \(the model is on cpu\)",
         cli=["--fast-path"], app={"fast_path": "1"},
         engine=lambda e: load(ModelSpec(str(e.paths["word"]), fast_path=True)), needs_no_cuda=True),
    Case("fast-path-with-device-map", r"fast_path=True is invalid: needs the whole model on one GPU \(leave out "
         r"--device-map\)", cli=["--device-map", "auto", "--fast-path"], app={"device_map": "auto", "fast_path": "1"},
         engine=lambda e: ModelSpec(str(e.paths["word"]), device_map="auto", fast_path=True)),
    Case("out-of-memory-loading", r"model='[^']*word' is invalid: does not fit in cpu memory \(CUDA out of memory.*\); "
         r"use dtype float16 or bfloat16, device cpu, or a smaller model", cli=[], patch=oom_on_move,
         engine=lambda e: load(ModelSpec(str(e.paths["word"])))),
    Case("forced-ids-out-of-range", r"forced_ids=\[99\] is invalid: token ids must be in \[0, 64\)",
         engine=lambda e: greedy(e, forced=[99])),
    # ---- command line syntax
    Case("strategy-unknown", r"argument --strategy: invalid choice: 'nope'", cli=["--strategy", "nope"]),
    Case("flag-not-a-number", r"argument --top-k: invalid int value: 'abc'", cli=["--top-k", "abc"]),
    Case("flag-not-for-strategy", r"num_beams=4 is invalid: does not apply to strategy 'greedy' \(only to beam\)$",
         cli=["--num-beams", "4"]),
    # ---- the output file (checked before the model loads)
    Case("out-directory-missing", r"out='[^']*nodir/t\.json' is invalid: its directory \S*nodir does not exist$",
         cli=["--out", "{tmp}/nodir/t.json"]),
    Case("out-is-a-directory", r"out='[^']*' is invalid: is a directory; give a file path$", cli=["--out", "{tmp}"]),
    Case("out-parent-is-a-file", r"out='[^']*notes\.txt/t\.json' is invalid: \S*notes\.txt is not a directory$",
         cli=["--out", "{notes}/t.json"]),
    Case("out-name-too-long", r"out='[^']*\.\.\.[^']*' is invalid: its file name is 305 bytes long; the limit here is "
         r"255$", cli=["--out", "{tmp}/" + "t" * 300 + ".json"]),
    # ---- what a trainer writes (checked before the model loads; nothing it did not write is replaced)
    Case("train-out-not-a-regular-file", r"out='[^']*pipe' is invalid: is not a regular file \(a device or a pipe\); "
         r"a trainer writes a weights file there and its model card beside it: give a file name$",
         train=["draft", "--model", "{word}", "--out", "{pipe}"], patch=no_model_load,
         engine=lambda e: check_outputs(e.paths["pipe"])),
    Case("train-out-named-md", r"out='[^']*w\.md' is invalid: ends in \.md, the name of its model card, which would "
         r"be written over the weights: give a name ending in \.safetensors$",
         train=["feature", "--model", "{word}", "--out", "{tmp}/w.md"], patch=no_model_load,
         engine=lambda e: check_outputs(e.tmp / "w.md")),
    Case("train-out-not-a-drafter-file", r"out='[^']*model\.safetensors' is invalid: is a file no trainer wrote \(not "
         r"a drafter weights file\); a trainer replaces only its own files: give another --out$",
         train=["parallel", "--model", "{word}", "--out", "{word}/model.safetensors"], patch=no_model_load,
         engine=lambda e: check_outputs(e.paths["word"] / "model.safetensors")),
    Case("train-out-card-not-a-card", r"out='[^']*notes\.safetensors' is invalid: its model card would replace "
         r"notes\.md, which is not a model card; move that file or give another --out$",
         train=["draft", "--model", "{word}", "--out", "{tmp}/notes.safetensors"], patch=no_model_load,
         engine=lambda e: check_outputs(e.tmp / "notes.safetensors")),
    Case("train-out-drafter-for-a-report", r"out='[^']*drafter\.safetensors' is invalid: is a drafter's weights or "
         r"model card; head-calibration writes a JSON report there: give another --out$",
         train=["head-calibration", "--draft", "{feature}", "--out", "{drafter}"], patch=no_model_load),
    # ---- trace files
    Case("trace-malformed-json", r"not valid JSON: Expecting property name", upload=lambda e: b"{nope"),
    Case("trace-not-an-object", r"a trace must be a JSON object", upload=lambda e: b"[1, 2]"),
    Case("trace-other-schema-version", r"schema_version='9\.0' is not supported \(this version reads 1\.x\)",
         upload=lambda e: traced(e, lambda d: d.update(schema_version="9.0"))),
    Case("trace-wrong-field-type", r"trace\.steps\[0\]\.chosen_id: expected int, got 'x'",
         upload=lambda e: traced(e, lambda d: d["steps"][0].update(chosen_id="x"))),
    Case("trace-over-size-limit",
         r"trace size=\d+ bytes is over the \d+ byte limit|is \d+ bytes, over the \d+ byte limit",
         upload=lambda e: b" " * (trace_mod.MAX_TRACE_BYTES + 1)),
    Case("trace-token-id-over-vocab", r"trace\.output_ids\[0\]=64 is out of range \(the model has 64 tokens\)",
         upload=lambda e: traced(e, lambda d: d["output_ids"].__setitem__(0, 64))),
    Case("trace-token-id-negative", r"trace\.steps\[1\]\.raw_top\[0\]\.token_id=-1 is out of range",
         upload=lambda e: traced(e, lambda d: d["steps"][1]["raw_top"][0].update(token_id=-1))),
    Case("trace-nested-too-deeply", r"not a trace: JSON nested too deeply", upload=lambda e: b"[" * 100_000),
    Case("trace-beam-source-out-of-range", r"trace\.steps\[3\]\.pool\[1\]\.source_beam=-1 is out of range \(0 to 2: "
         r"the previous step's live beams\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][3]["pool"][1].update(source_beam=-1), "beam")),
    Case("trace-dspark-node-parent", r"trace\.steps\[1\]\.nodes\[1\]\.parent=2 is out of range \(0 to 1: the root 0 "
         r"or a node before node 2\)$", upload=lambda e: traced(e, lambda d: d["steps"][1]["nodes"][1].update(parent=2),
                                                                  "dspark")),
    Case("trace-dspark-node-depth", r"trace\.steps\[1\]\.nodes\[1\]\.depth=1000000 is not its parent's depth \+ 1 "
         r"\(2\)$", upload=lambda e: traced(e, lambda d: d["steps"][1]["nodes"][1].update(depth=10**6), "dspark")),
    Case("trace-dspark-accepted-path", r"trace\.steps\[1\]\.accepted_path\[0\]=3 is not a node of the round \(1 to "
         r"2\)$", upload=lambda e: traced(e, lambda d: d["steps"][1]["accepted_path"].append(3), "dspark")),
    Case("trace-dspark-dp-path", r"trace\.steps\[1\]\.dp\.path\[1\]=2 is out of range \(0 to 1: the candidates of "
         r"lattice position 2\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][1]["dp"]["path"].__setitem__(1, 2), "dspark")),
    Case("trace-spec-accepted-over-gamma", r"trace\.steps\[0\]\.accepted=3 is out of range \(0 to gamma=2\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][0].update(accepted=3), "speculative")),
    Case("trace-step-kind-unhashable", r"trace\.steps\[1\]: unknown step kind \[\]$",
         upload=lambda e: traced(e, lambda d: d["steps"][1].update(kind=[]))),
    Case("trace-step-of-other-strategy", r"trace\.steps\[3\]\.kind='beam' does not belong to a sample trace "
         r"\(expected 'token'\)$",
         upload=lambda e: traced(e, lambda d: d["steps"].__setitem__(3, steps_of(e, "beam")[3]))),
    Case("trace-step-index", r"trace\.steps\[2\]\.index=7 is not the step's place in trace\.steps \(2\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][2].update(index=7))),
    Case("trace-lone-surrogate", r"trace\.steps\[1\]\.raw_top\[0\]\.piece='\\ud800' is not valid Unicode: a lone "
         r"surrogate '\\ud800' at character 0$",
         upload=lambda e: traced(e, lambda d: d["steps"][1]["raw_top"][0].update(piece="\ud800"))),
    Case("trace-not-finite", r"trace\.steps\[0\]\.entropy_raw=nan is not a finite number of magnitude <= 1e\+300$",
         upload=lambda e: traced(e, lambda d: d["steps"][0].update(entropy_raw=float("nan")))),   # a NaN literal
    Case("trace-null-not-a-logit", r"trace\.steps\[1\]\.processed_top\[1\]\.prob=None is not a number: only logits, "
         r"log-probabilities and scores may be -inf \(null\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][1]["processed_top"][1].update(prob=None))),
    Case("trace-list-over-limit", r"trace\.steps\[2\]\.raw_top: 101 candidates is over the limit of 100$",
         upload=lambda e: traced(e, lambda d: d["steps"][2].update(raw_top=d["steps"][2]["raw_top"][:1] * 101))),
    Case("trace-string-over-limit", r"trace\.steps\[0\]\.raw_top\[0\]\.piece: a string of 4097 characters is over "
         r"the 4096 character limit$",
         upload=lambda e: traced(e, lambda d: d["steps"][0]["raw_top"][0].update(piece="x" * 4097))),
    Case("trace-too-many-steps", r"trace\.steps: 1048577 steps is over the 1048576 step limit$",   # 3 MB: [..., 0, 0]
         upload=lambda e: traced(e, lambda d: d["steps"].extend([0] * (trace_mod.MAX_STEPS + 1 - len(d["steps"]))))),
    Case("trace-integer-too-long", r"not valid JSON: Exceeds the limit \(4300 digits\) for integer string conversion: "
         r"value has 5000 digits",
         upload=lambda e: traced(e, lambda d: None).replace(b'"index": 1,', b'"index": ' + b"9" * 5000 + b",", 1)),
    Case("trace-schema-version-malformed", r"schema_version='１\.5' is not 'major\.minor' \(ASCII digits, e\.g\. "
         r"'1\.7'\)$", upload=lambda e: traced(e, lambda d: d.update(schema_version="１.5"))),
    Case("trace-closed-set-value", r"trace\.stop_reason='done' is not one of eos, max_new_tokens, stopped, error$",
         upload=lambda e: traced(e, lambda d: d.update(stop_reason="done"))),
    Case("trace-config-not-finite", r"trace\.config\.temperature=nan is not a finite number of magnitude <= 1e\+300$",
         upload=lambda e: traced(e, lambda d: d["config"].update(temperature=float("nan")))),   # a NaN literal
    Case("trace-output-not-the-steps", r"trace\.output_ids\[0\]=\d+ is not the steps' token \d+ \(the new tokens "
         r"the steps emitted\)$",
         upload=lambda e: traced(e, lambda d: d["output_ids"].__setitem__(0, (d["output_ids"][0] + 1) % 64))),
    Case("trace-stats-not-the-steps", r"trace\.stats\.new_tokens=99 is not the \d+ tokens of output_ids$",
         upload=lambda e: traced(e, lambda d: d["stats"].update(new_tokens=99))),
    Case("trace-text-without-output", r"trace\.text='hello' is not empty, but output_ids is$",
         upload=lambda e: traced(e, empty_output_with_text)),
    Case("trace-verdict-not-the-round", r"trace\.steps\[0\]\.drafts\[1\]\.verdict='\w+' is not '\w+' \(gamma=2, "
         r"accepted=\d\)$", upload=lambda e: traced(e, flip_last_verdict, "speculative")),
    Case("trace-drafting-on-a-later-round", r"trace\.steps\[1\]\.drafting: recorded on a drafting round; only the "
         r"prefill round carries it$", upload=lambda e: traced(e, copy_drafting_to_round_1, "dspark")),
    Case("trace-sources-not-the-lookup-flag", r"trace\.steps\[1\]\.lattice\[0\]\.cells\[0\]\.sources=\['parallel'\] "
         r"does not go with lookup=True \(a token on prompt lookup's chain was proposed by lookup\)$",
         upload=lambda e: traced(e, lambda d: d["steps"][1]["lattice"][0]["cells"][0].update(lookup=True), "dspark")),
    Case("trace-field-newer-than-version",
         r"trace\.steps\[0\]\.drafting: is a field of schema 1\.6; this trace says schema_version '1\.5'$",
         upload=lambda e: traced(e, lambda d: d.update(schema_version="1.5"), "speculative")),
    # ---- runs that stop mid-way (the trace so far is kept)
    Case("logits-nan", r"logits: NaN at step 3 \(64 of 64 values from model '[^']*nan'\); the run stops here",
         cli=["--model", "{nan}", "--max-new-tokens", "8"],
         app={"model": "{nan}", "prompt": PROMPT, "chat": "0", "max_new": "8"}, action="run_end",
         engine=lambda e: run(load(ModelSpec(str(e.paths["nan"]))), [1, 2, 3], GreedyConfig(max_new_tokens=8))),
    Case("logits-inf", r"logits: \+inf at step 2 \(1 of 64 values from model '[^']*word'\)",
         patch=bad_logits_after(2, float("inf"), entries=5), engine=lambda e: greedy(e, 6)),
    Case("cuda-out-of-memory", r"memory: out of memory at step 2 \(CUDA out of memory\. Tried to allocate 2\.00 GiB "
         r"\(simulated\)\); reduce max_new_tokens=\d+, or use dtype float16 or bfloat16, or a smaller model",
         cli=["--max-new-tokens", "6"], app={"max_new": "6"}, action="run_end", patch=oom_after(2),
         engine=lambda e: greedy(e, 6)),
]
CASE_IDS = [c.id for c in CASES]


def cases_for(place: str):
    return [pytest.param(c, id=c.id) for c in CASES if place in c.where]


# ------------------------------------------------------------------------------ fixtures

def write_bad_cost_tables(paths: dict) -> None:
    """Cost tables over each cap: a sparse file one byte over MAX_COST_BYTES, JSON nested 10,000 deep,
    one entry more than MAX_COST_ENTRIES."""
    with open(paths["hugecost"], "wb") as file:
        file.truncate(MAX_COST_BYTES + 1)
    paths["deepcost"].write_text("[" * 10_000 + "]" * 10_000)
    paths["longcost"].write_text(json.dumps({"version": 1, "verify_ms": [1.0] * (MAX_COST_ENTRIES + 1)}))


def write_broken_configs(paths: dict) -> None:
    """Copies of the word model: one whose config.json is not JSON, one without config.json, one whose architecture
    is custom code (auto_map)."""
    for name in ("badcfg", "nocfg", "custom"):
        shutil.copytree(paths["word"], paths[name])
    (paths["badcfg"] / "config.json").write_text("{broken")
    (paths["nocfg"] / "config.json").unlink()
    config = json.loads((paths["custom"] / "config.json").read_text())     # an architecture of its own code
    config.update(model_type="xmodel", auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (paths["custom"] / "config.json").write_text(json.dumps(config))


def write_damaged_weights(paths: dict, lm: LM) -> None:
    """A shallow draft of the word model without its head's vocab_ids, a drafter whose header says
    gamma_max=999 and one whose w2 is NaN."""
    good = paths["tmp"] / "shallow-good.safetensors"
    save_shallow(build_shallow(lm, 1, 1), good)
    rewrite(good, paths["badshallow"], drop="head.vocab_ids")
    rewrite(paths["drafter"], paths["baddrafter"], header=BAD_HEADER["parallel"])
    nan_copy(paths["drafter"], paths["nandrafter"], "w2")
    write_other_model_drafters(paths, lm)
    write_hostile_drafters(paths)


def write_hostile_drafters(paths: dict) -> None:
    """Small drafter files whose header asks for far more than they hold (a dimension of 2**16: the old reader
    allocated it before any check), holds metadata of the wrong JSON type, or vocabulary ids that are negative
    or repeated."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from decoding.drafters.feature_net import FeatureNet, FeatureShape, save_feature

    feature = paths["tmp"] / "feature-good.safetensors"
    save_feature(FeatureNet(FeatureShape(32, 8, 8, 1), range(8)), feature)
    with safe_open(str(paths["drafter"]), "pt") as fh:
        shape = json.loads(fh.metadata()["shape"])
    rewrite(paths["drafter"], paths["bigdrafter"], header={"shape": json.dumps({**shape, "trunk": 2**16})})
    rewrite(feature, paths["bigfeature"], header={"shape": json.dumps({"hidden_size": 32, "width": 2**14, "mlp": 8,
                                                                         "blocks": 1})})
    rewrite(paths["drafter"], paths["listdrafter"], header={"meta": "[1, 2]"})
    rewrite(feature, paths["listfeature"], header={"meta": "[1, 2]"})
    rewrite(paths["drafter"], paths["badjsondrafter"], header={"meta": "{not json"})
    rewrite(feature, paths["blocksfeature"], header={"shape": json.dumps({"hidden_size": 32, "width": 8, "mlp": 8,
                                                                           "blocks": 10**9})})
    for name, ids in (("negfeature", [-1, *range(1, 8)]), ("dupfeature", [1, *range(1, 8)])):
        with safe_open(str(feature), "pt") as fh:
            meta, tensors = fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}
        save_file({**tensors, "vocab_ids": torch.tensor(ids)}, str(paths[name]), metadata=meta)


def write_other_model_drafters(paths: dict, lm: LM) -> None:
    """A feature and a parallel drafter of the word model's shape that record another model's fingerprint (its
    weights differ), and an older feature drafter (no fingerprint) for a model of hidden size 16."""
    from decoding.drafters.feature_net import FeatureNet, FeatureShape, save_feature
    from decoding.runtime.fingerprint import TARGET_KEY, fingerprint

    other = fingerprint(lm)
    other = {TARGET_KEY: {**other, "weights": [w + 1.0 for w in other["weights"]]}}
    hidden = lm.model.config.hidden_size
    save_feature(FeatureNet(FeatureShape(hidden, 8, 8, 1), range(8)), paths["otherfeature"], meta=other)
    random_drafter(lm, gamma_max=4).save(paths["otherparallel"], meta=other)
    save_feature(FeatureNet(FeatureShape(16, 8, 8, 1), range(8)), paths["oldfeature"], meta={"target": "old"})


def record_traces(lm: LM, drafter) -> dict[str, str]:
    """Small real traces of the word model (4 new tokens each) as JSON, by strategy: the speculative
    prompt repeats, so that the lookup draft proposes gamma=2 tokens in round 0."""
    runs = {"sample": ([1, 2, 3], SampleConfig(max_new_tokens=4, seed=1), {}),
            "beam": ([1, 2, 3], BeamConfig(max_new_tokens=4, num_beams=3), {}),
            "speculative": ([1, 2, 3, 1, 2, 3, 1, 2], SpeculativeConfig(draft="lookup", max_new_tokens=4, gamma=2), {}),
            "dspark": ([1, 2, 3], chain_config(max_new_tokens=4, gamma=3), {"drafter": drafter})}
    return {name: to_json(run(lm, ids, config, **kw)) for name, (ids, config, kw) in runs.items()}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Model directories and files the cases name, the word model loaded, a drafter for it."""
    tmp = tmp_path_factory.mktemp("bad_input")
    paths = {"tmp": tmp, "word": build_word_model_dir(tmp / "word"),
             "word80": build_word_model_dir(tmp / "word80", vocab=80),
             "vword": build_word_model_dir(tmp / "vword", prefix="v"),
             "empty": tmp / "empty", "notes": tmp / "notes.txt", "broken": tmp / "broken.gguf",
             "corrupt": tmp / "corrupt.gguf", "drafter": tmp / "drafter.safetensors",
             "badcost": tmp / "cost.json", "shortcost": tmp / "short.json", "hugecost": tmp / "huge.json",
             "deepcost": tmp / "deep.json", "longcost": tmp / "long.json", "badshallow": tmp / "s.safetensors",
             "baddrafter": tmp / "p.safetensors", "badcfg": tmp / "badcfg", "nocfg": tmp / "nocfg",
             "nandrafter": tmp / "nan-p.safetensors", "otherfeature": tmp / "other-f.safetensors",
             "otherparallel": tmp / "other-p.safetensors", "oldfeature": tmp / "old-f.safetensors",
             "custom": tmp / "custom", "pipe": tmp / "pipe", "feature": tmp / "feature-good.safetensors",
             "bigdrafter": tmp / "big-p.safetensors",
             "bigfeature": tmp / "big-f.safetensors",
             "listdrafter": tmp / "list-p.safetensors", "listfeature": tmp / "list-f.safetensors",
             "negfeature": tmp / "neg-f.safetensors", "dupfeature": tmp / "dup-f.safetensors",
             "badjsondrafter": tmp / "badjson-p.safetensors", "blocksfeature": tmp / "blocks-f.safetensors"}
    nan_dir, nan_step = build_nan_model_dir(tmp / "nan")
    paths["nan"] = nan_dir
    paths["empty"].mkdir()
    paths["notes"].write_text("not a model\n")
    (tmp / "notes.md").write_text("# my notes, not a model card\n")
    os.mkfifo(paths["pipe"])
    paths["broken"].write_bytes(b"not a gguf at all")
    paths["corrupt"].write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    paths["badcost"].write_text("not json\n")
    CostTable(verify_ms=(1.0, 2.0)).save(paths["shortcost"])
    write_bad_cost_tables(paths)
    write_broken_configs(paths)
    paths["bloom"] = build_bloom_dir(tmp / "bloom")
    lm = load(ModelSpec(str(paths["word"])))
    drafter = random_drafter(lm, gamma_max=4)
    drafter.save(paths["drafter"])
    write_damaged_weights(paths, lm)
    return types.SimpleNamespace(tmp=tmp, paths=paths, lm=lm, drafter=drafter, nan_step=nan_step,
                                 traces=record_traces(lm, drafter))


@pytest.fixture(autouse=True)
def _no_download(monkeypatch):
    """Model ids are looked up in local files only (as with no network)."""
    monkeypatch.delenv("DECODESCOPE_ALLOW_DOWNLOAD", raising=False)


def fill(value: str, env) -> str:
    return value.format(**{k: str(v) for k, v in env.paths.items()})


def skip_if_needed(case: Case) -> None:
    if case.needs_no_cuda and torch.cuda.is_available():
        pytest.skip("CUDA is available here, so device=cuda is not bad input")


# ------------------------------------------------------------------------------ engine

def engine_message(case: Case, env) -> str:
    """The message the engine gives: the error raised, or the .error of the trace returned."""
    try:
        result = from_json(case.upload(env)) if case.upload else case.engine(env)
    except (ConfigError, TraceFormatError) as err:
        return str(err)
    assert isinstance(result, Trace) and result.error, f"{case.id}: accepted ({result!r:.200})"
    assert result.stop_reason == "error"
    return result.error


@pytest.mark.parametrize("case", cases_for("engine"))
@pytest.mark.slow
def test_engine(case, env, monkeypatch):
    skip_if_needed(case)
    if case.patch:
        case.patch(monkeypatch)
    line = one_line(engine_message(case, env))
    assert re.search(case.pattern, line), line


# ------------------------------------------------------------------------------ CLI

@pytest.mark.parametrize("case", cases_for("CLI"))
def test_cli(case, env, capsys, monkeypatch):
    skip_if_needed(case)
    if case.patch:
        case.patch(monkeypatch)
    base = ["run", "--model", str(env.paths["word"]), "--prompt", PROMPT, "--max-new-tokens", "4"]
    argv = ["train"] + case.train if case.train is not None else base + case.cli
    code, out, err = cli_main([fill(a, env) for a in argv], capsys)
    assert code == 2, (code, out, err)
    line = one_line(err)
    assert line.startswith("error: ") and "Traceback" not in err
    assert re.search(case.pattern, line), line


@pytest.mark.slow
def test_cli_nan_model_keeps_text_and_trace(env, tmp_path):
    """A real process: exit 2, one error line, and the text and trace of the steps before the NaN."""
    import subprocess
    import sys

    out = tmp_path / "t.json"
    res = subprocess.run([sys.executable, "-m", "decoding", "run", "--model", str(env.paths["nan"]), "--prompt",
                          PROMPT, "--max-new-tokens", "8", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert one_line(res.stderr).startswith(f"error: logits: NaN at step {env.nan_step} ")
    assert f"[greedy] {env.nan_step} tokens" in res.stdout
    kept = from_json(out.read_bytes())
    assert len(kept.steps) == env.nan_step and kept.stop_reason == "error" and kept.error.startswith("logits: NaN")


# ------------------------------------------------------------------------------ nothing lost, every strategy

def _strategies(lm):
    draft = LM(varied_llama(seed=1, vocab=lm.vocab_size).model, lm.tokenizer, name="varied-1")
    drafter = random_drafter(lm, gamma_max=4)
    return {
        "greedy": (GreedyConfig(max_new_tokens=8), {}),
        "sample": (SampleConfig(max_new_tokens=8, temperature=0.9, seed=2), {}),
        "beam": (BeamConfig(max_new_tokens=8, num_beams=3), {}),
        "speculative-lookup": (SpeculativeConfig(draft="lookup", max_new_tokens=8, gamma=3), {}),
        "speculative-draft": (SpeculativeConfig(max_new_tokens=8, gamma=2, draft="d", temperature=0.8),
                              {"drafter": draft}),
        "dspark-chain": (chain_config(max_new_tokens=8, gamma=3), {"drafter": drafter}),
        "dspark-tree": (DSparkConfig(max_new_tokens=8, gamma=3, select="tree", budget=6), {"drafter": drafter}),
    }


@pytest.fixture(scope="module")
def strategies(env):
    return _strategies(env.lm)


STRATEGY_NAMES = ["greedy", "sample", "beam", "speculative-lookup", "speculative-draft", "dspark-chain", "dspark-tree"]


def _same_prefix(kept: Trace, clean: Trace) -> None:
    """The kept steps are exactly the clean run's first steps (nothing garbage, nothing lost)."""
    assert len(kept.steps) >= 1
    assert without_timings(kept.steps) == without_timings(clean.steps[:len(kept.steps)])


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("kind,value", [("NaN", float("nan")), ("+inf", float("inf"))])
def test_non_finite_logits_stop_every_strategy(name, kind, value, env, strategies, monkeypatch):
    config, kwargs = strategies[name]
    clean = run(env.lm, [1, 2, 3], config, **kwargs)
    assert clean.error is None and len(clean.steps) >= 3
    with monkeypatch.context() as mp:
        bad_logits_after(2, value, entries=7, only=env.lm.model)(mp)    # the target's third forward on
        kept = run(env.lm, [1, 2, 3], config, **kwargs)
    assert kept.stop_reason == "error"
    assert kept.error.startswith(f"logits: {kind} at step {len(kept.steps)} ("), kept.error
    _same_prefix(kept, clean)
    assert from_json(to_json(kept)).error == kept.error                   # and it saves


def test_nan_from_the_draft_model_names_it(env, strategies, monkeypatch):
    config, kwargs = strategies["speculative-draft"]
    bad_logits_after(3, float("nan"), only=kwargs["drafter"].model)(monkeypatch)
    kept = run(env.lm, [1, 2, 3], config, **kwargs)
    assert re.match(r"logits: NaN at step \d+ \(64 of 64 values from model 'varied-1'\)", kept.error), kept.error


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_partial_neg_inf_logits_are_not_an_error(name, env, strategies, monkeypatch):
    """Negative control: -inf at some entries (a masked token) is a valid distribution."""
    config, kwargs = strategies[name]
    bad_logits_after(0, float("-inf"), entries=slice(0, 5), only=env.lm.model)(monkeypatch)
    done = run(env.lm, [1, 2, 3], config, **kwargs)
    assert done.error is None and done.stats.new_tokens >= 1


def test_without_the_check_nan_logits_give_garbage(env, monkeypatch):
    """Negative control: with the check turned off, greedy silently emits a token from NaN logits."""
    monkeypatch.setattr(LM, "check_logits", lambda self, logits: logits)
    bad_logits_after(2, float("nan"), entries=7, only=env.lm.model)(monkeypatch)
    garbage = greedy(env, 6)
    assert garbage.error is None and 7 in garbage.output_ids[2:]


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_out_of_memory_keeps_the_trace_and_says_what_to_reduce(name, env, strategies, monkeypatch):
    config, kwargs = strategies[name]
    clean = run(env.lm, [1, 2, 3], config, **kwargs)
    calls = 2 if name != "speculative-draft" else 4                 # the draft model's forwards count too
    oom_after(calls)(monkeypatch)
    kept = run(env.lm, [1, 2, 3], config, **kwargs)
    assert kept.error.startswith(f"memory: out of memory at step {len(kept.steps)} (CUDA out of memory"), kept.error
    for knob in ("max_new_tokens", "num_beams", "gamma", "budget", "top_k_candidates"):
        named = f"{knob}={getattr(config, knob, None)}" in kept.error
        assert named == (hasattr(config, knob) and (knob != "budget" or config.select == "tree")), knob
    _same_prefix(kept, clean)


# ------------------------------------------------------------------------------ app

@pytest.fixture(scope="module")
def app_model(tiny_dir):
    """The tiny app model of test_app (DECODESCOPE_MODEL points at it)."""
    return tiny_dir


def new_app(query: dict):
    return app_tests.new_app({"max_new": "4", **query})


def upload(at, payload: bytes, page: str = "app_pages/traces.py", key: str = "tr.upload"):
    at.switch_page(page).run()
    at.file_uploader(key=key).set_value(("bad.json", payload, "application/json")).run()
    return at


def path_widget(name: str, strategy: str | None) -> str:
    return {"model": ui_keys.MODEL, "gguf_file": ui_keys.GGUF_FILE}.get(name) or ui_keys.param_key("w", strategy, name)


def open_app(case: Case, env, typed: bool = True):
    """The app with the case's values from the link; server paths typed in the sidebar instead when
    `typed` (a path a link sets gets one line whatever the cause: test_app_link_paths_...)."""
    values = {k: fill(v, env) for k, v in case.app.items()}
    at = new_app({k: v for k, v in values.items() if not (typed and k in LINK_PATHS)})
    for name in (n for n in LINK_PATHS if typed and n in values):
        at.text_input(key=path_widget(name, values.get("strategy"))).set_value(values[name]).run()
    return at


def errors_of(at) -> list[str]:
    """The error boxes' text as the reader sees it (their Markdown read)."""
    assert not at.exception, [e.value for e in at.exception]
    return [shown(e.value) for e in at.error]


@pytest.mark.parametrize("case", cases_for("app"))
def test_app(case, env, app_model, monkeypatch):
    skip_if_needed(case)
    if case.patch:
        case.patch(monkeypatch)
    if case.upload:
        if case.id == "trace-over-size-limit":                          # not 50 MB through AppTest
            monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", 1000)
        at = upload(new_app({}), case.upload(env))
    else:
        at = open_app(case, env)
        if case.sidebar:
            case.sidebar(at, env)
        if case.action == "step":
            at.button(key="pg.step").click().run()
        elif case.action == "run_end":
            run_to_end(at)
    errors = errors_of(at)
    lines = [shown(w.value) for w in at.warning] if case.warning else errors
    assert any(re.search(case.pattern, e) for e in lines), (errors, lines)
    assert all(len(e.strip().splitlines()) == 1 for e in errors + lines), lines


def link_path(case: Case) -> str | None:
    """The server-path parameter a case's message is about, when the case sets it in the app."""
    return next((n for n in LINK_PATHS if case.app and n in case.app and case.pattern.startswith(f"{n}=")), None)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if link_path(c)])
def test_app_link_paths_say_only_that_they_cannot_be_used(case, env, app_model):
    """The same path typed in the sidebar gets the full message (test_app); from a link, whatever the
    cause (missing, not a directory, damaged, another vocabulary), only that it cannot be used."""
    at = open_app(case, env, typed=False)
    if case.action == "step":
        at.button(key="pg.step").click().run()
    errors, name = errors_of(at), link_path(case)
    line = rf"(^|: ){name}='[^']*' from the link cannot be used on this server \(a link is not told why; a value " \
           r"typed in the sidebar is\)$"
    assert any(re.search(line, e) for e in errors), errors
    assert not any(re.search(case.pattern, e) for e in errors), errors


def test_app_error_mid_run_keeps_the_trace_viewable_and_downloadable(env, app_model):
    at = new_app({"model": str(env.paths["nan"]), "prompt": PROMPT, "chat": "0", "max_new": "8"})
    run_to_end(at)
    run_state = at.session_state["ds.run"]
    assert len(run_state.events) == env.nan_step and run_state.error.startswith("logits: NaN")
    assert any(f'data-step="{env.nan_step - 1}"' in h.value for h in at.html)      # the chips are shown
    kept = run_state.trace()
    assert kept.stop_reason == "error" and kept.error == run_state.error
    at.switch_page("app_pages/traces.py").run()
    assert not at.exception
    assert at.get("download_button")
    assert any("stopped with an error" in w.value and "logits: NaN" in w.value for w in at.warning)
    assert to_dict(from_json(to_json(kept))) == to_dict(kept)


def test_app_out_of_memory_keeps_the_steps(env, app_model, monkeypatch):
    oom_after(2)(monkeypatch)
    at = run_to_end(new_app({"max_new": "6"}))
    run_state = at.session_state["ds.run"]
    assert len(run_state.events) == 2 and run_state.trace().error.startswith("memory: out of memory at step 2")
    assert any("reduce max_new_tokens=6" in e for e in errors_of(at))


# ------------------------------------------------------------------------------ the README table

def readme_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("\n## Bad input\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = [w.strip() for w in match.group(2).split(",")]
    return rows


def test_readme_table_lists_every_case_where_it_is_tested():
    rows = readme_rows()
    assert list(rows) == CASE_IDS
    assert {cid: rows[cid] for cid in CASE_IDS} == {c.id: c.where for c in CASES}
    assert len(CASES) >= 20 and len(set(CASE_IDS)) == len(CASE_IDS)


# ------------------------------------------------------------------------------ drafter files (no memory from a header)

def test_a_drafter_header_allocates_nothing_before_its_check(env, monkeypatch):
    """The drafter a hostile header describes is built on the meta device only (no memory) and refused there;
    negative control: a good file is built on meta, then for real."""
    from decoding.drafters import parallel

    devices, real = [], parallel.ParallelDrafter.__init__

    def init(self, *args, **kwargs):
        devices.append(torch.get_default_device().type)
        real(self, *args, **kwargs)

    monkeypatch.setattr(parallel.ParallelDrafter, "__init__", init)
    with pytest.raises(ConfigError, match="its header does not match its tensors"):
        parallel.load_drafter(env.paths["bigdrafter"], env.lm)
    assert devices == ["meta"]
    parallel.load_drafter(env.paths["drafter"], env.lm)
    assert devices == ["meta", "meta", "cpu"]


def test_a_header_asking_for_a_billion_blocks_is_refused_at_once(env, tmp_path):
    bad = tmp_path / "blocks-f.safetensors"
    rewrite(env.tmp / "feature-good.safetensors", bad,
            header={"shape": json.dumps({"hidden_size": 32, "width": 8, "mlp": 8, "blocks": 10**9})})
    with pytest.raises(ConfigError, match=r"could not be read \(its header asks for 1000000000 blocks; the file holds "
                                          r"\d+ tensors\)$"):
        load_draft(f"feature:{bad}", env.lm)


def test_the_recorded_target_is_named_without_its_folder(env, tmp_path):
    """A drafter trained for another model is labelled with that model's own name, never the folder it sat in on
    the machine that trained it (the label goes into traces and onto the page)."""
    named = tmp_path / "named-f.safetensors"
    rewrite(env.tmp / "feature-good.safetensors", named,
            header={"meta": json.dumps({"target": "/srv/private/models/tiny-llama"})})
    label = load_draft(f"feature:{named}", env.lm).name
    assert label.endswith(" (trained for tiny-llama)") and "/srv" not in label, label


# ------------------------------------------------------------------------------ smaller edges

def test_a_draft_model_folder_with_a_plus_in_its_name(env, tmp_path):
    """A draft model's folder may have '+' in its name: DSpark's `model:` part keeps it whole (it was read as a
    trained drafter file 'model:/m/a' + ... and refused as "no drafter weights there")."""
    from decoding.core.draft_names import read_drafter

    def drafter_parts(name):
        spec = read_drafter(name)
        return spec.trained.text if spec.trained else None, tuple(part.text for part in spec.sources)

    assert drafter_parts("model:/m/a+b") == (None, ("model:/m/a+b",))
    assert drafter_parts("feature+model:/m/a+b+recycling") == ("feature", ("model:/m/a+b", "recycling"))
    assert drafter_parts("/m/a+b.safetensors+suffix") == ("/m/a+b.safetensors", ("suffix",))     # control
    folder = shutil.copytree(env.paths["word"], tmp_path / "draft+copy")
    done = run(env.lm, [1, 2, 3], DSparkConfig(drafter=f"model:{folder}", max_new_tokens=3, gamma=2))
    assert done.error is None and done.stats.new_tokens == 3


def test_link_redaction_covers_every_message_that_shows_the_link_path():
    """A server path a link set (and the sidebar still holds) is never shown back, whichever message carries it:
    a run's NaN line naming the model, a drafter labelled with the model it was trained for. Negative controls:
    the same path typed in the sidebar, and a message that does not show it, pass unchanged."""
    from ui.widgets.params import link_safe

    link = {"model": "/srv/models/nan-model", "drafter": "/srv/d/p.safetensors"}
    uniform = r"^model='/srv/models/nan-model' from the link cannot be used on this server \(a link is not told why"
    nan = "logits: NaN at step 3 (64 of 64 values from model '/srv/models/nan-model'); the run stops here"
    assert re.match(uniform, link_safe(nan, link, link))
    trained = "draft='feature' is invalid: was trained for another model (trained for nan-model)"
    assert re.match(uniform, link_safe(trained, {"model": link["model"]}, link))
    assert link_safe("gamma=6 is invalid: see p.safetensors", link, link).startswith("drafter='/srv/d/p.safetensors'")
    over = "gamma=6 is invalid: must be <= the gamma_max (4) of drafter '/srv/d/p.safetensors'"   # gamma-over-drafter
    assert link_safe(over, link, link).startswith("drafter='/srv/d/p.safetensors' from the link cannot be used")
    assert link_safe(nan, link, {**link, "model": "/home/me/nan-model"}) == nan        # typed in the sidebar
    assert link_safe("temperature=-0.5 is invalid", link, link) == "temperature=-0.5 is invalid"


# ------------------------------------------------------------------------------ bench load's flags in errors.md

BENCH_LOAD_REFUSALS = [["--sessions", "a,b"], ["--sessions", "0"], ["--steps", "51"], ["--client", "firefox"],
                       ["--pace", "soon"], ["--pace", "-1"], ["--pace", "1e300"],
                       ["--client", "ws", "--browsers", "low"]]


def bench_load_refusal(argv: list[str]) -> str | None:
    """The line `python -m bench load` exits with for these flags (None: it would run); nothing starts."""
    from bench.load import _checked

    try:
        _checked(argv)
    except SystemExit as exit_info:
        return str(exit_info.code)
    return None


def test_errors_md_quotes_every_bench_load_refusal():
    """docs/errors.md's Benchmarks table holds exactly the messages bench load gives for its bad flags (the
    --pace cap of issue 47 among them). Negative controls: another value's message is not in the table (the
    match is exact), and a good --pace is not refused."""
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    quoted = re.findall(r"^\|[^|]+\| `([^`]+)` \|$", section, re.MULTILINE)
    given = [bench_load_refusal(argv) for argv in BENCH_LOAD_REFUSALS]
    assert sorted(given, key=str) == sorted(quoted) and len(quoted) == len(BENCH_LOAD_REFUSALS)
    assert bench_load_refusal(["--pace", "700"]) not in quoted
    assert bench_load_refusal(["--pace", "3", "--client", "ws"]) is None
