"""Tiny llamas and drafters for the dspark tests (no download, built in a few ms)."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from conftest import on_test_device

from bench.dspark import PARALLEL
from decoding.core.lattice import LookupInput
from decoding.drafters.feature_lattice import FeatureLatticeDrafter
from decoding.drafters.feature_net import FeatureNet, FeatureShape
from decoding.drafters.parallel import DrafterShape, ParallelDrafter
from decoding.runtime.models import LM
from decoding.strategies import dspark
from decoding.train.parallel import TrainSettings


def varied_llama(seed: int = 0, vocab: int = 64, hidden: int = 32, init: float = 0.3,
                 eos_token_id: int | None = None) -> LM:
    """A random 2-layer llama whose greedy output does not collapse into a repeated token
    (large init, untied head), so a random drafter is often wrong."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None,
                      initializer_range=init, tie_word_embeddings=False)
    model = on_test_device(LlamaForCausalLM(cfg).eval())
    model.generation_config.eos_token_id = eos_token_id
    return LM(model, tokenizer=None, name=f"varied-{seed}")


def random_drafter(lm: LM, gamma_max: int = 8, seed: int = 0, vocab_ids=None, layers: int = 0,
                   window: int = 1, feature_layers=(), parent_mlp: bool = False) -> ParallelDrafter:
    hidden = lm.model.config.hidden_size
    shape = DrafterShape(hidden, lm.vocab_size, gamma_max=gamma_max, rank=8, trunk=32, width=16, layers=layers,
                         window=window, heads=4, mlp=32, feature_layers=tuple(feature_layers), parent_mlp=parent_mlp)
    drafter = ParallelDrafter(shape, vocab_ids=vocab_ids, seed=seed)
    with torch.no_grad():       # make the random drafter confidently wrong, not near-silent
        drafter.w2.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
        drafter.seq_in.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
        drafter.conf_w.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + 2))
        if parent_mlp:
            drafter.parent_in.normal_(0, 1.0, generator=torch.Generator().manual_seed(seed + 3))
        for i, block in enumerate(drafter.blocks):   # blocks start as the identity: make them matter
            gen = torch.Generator().manual_seed(seed + 10 + i)
            block.out.weight.normal_(0, 0.5, generator=gen)
            block.down.weight.normal_(0, 0.5, generator=gen)
    return drafter.eval().attach(lm)


def one_thread():
    """Generator for a module fixture: tiny models run fastest on one thread (and far faster than
    on two when other processes load the CPU); restores the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def module_cache(tmp_path_factory):
    """Generator for a module fixture: distillation data and cost tables go to a temporary cache
    (module scope, so that module fixtures that train or profile use it too)."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECODESCOPE_CACHE", str(path))
        yield path


def split_drafter(lm: LM, token: int, path, others=(11, 13, 30)):
    """Save (to `path`) a drafter over [token] + two other tokens whose first draft is `token` and
    whose second is pushed by the sequential head to another token: for a model that keeps emitting
    `token` (the tiny app model), every round at temperature 0 then has an accepted and a rejected
    draft. Returns the path as a string."""
    others = [t for t in others if t != token][:2]
    drafter = random_drafter(lm, gamma_max=8, seed=0, vocab_ids=[token] + others)
    with torch.no_grad():
        e = drafter.embed_tokens(torch.tensor([token]))[0].float()                 # (H,)
        drafter.seq_in.zero_()
        drafter.seq_out.zero_()
        drafter.seq_in[1] = (e / e.dot(e))[:, None].expand(-1, drafter.shape.rank) * 10.0
        drafter.seq_out[1] = 1.0                                                    # towards others[0]
    drafter.save(path)
    return str(path)


def app_drafter(model_dir) -> str:
    """split_drafter for the tiny app model in `model_dir`, saved next to it (built once)."""
    from pathlib import Path

    from decoding.core.config import GreedyConfig
    from decoding.runner import run
    from decoding.runtime.models import ModelSpec, load
    from ui.widgets.params import Settings

    path = Path(model_dir) / "dspark-test-drafter.safetensors"
    if not path.is_file():
        lm = load(ModelSpec(name=str(model_dir)))
        token = run(lm, lm.encode(Settings.prompt), GreedyConfig(max_new_tokens=3)).output_ids[-1]
        split_drafter(lm, token, path)
    return str(path)


# DSpark's defaults before the sequential head became the default drafter (the parallel drafter, a chain
# of γ positions, two candidates each, no prompt lookup): what the tests written for that drafter assume,
# and what `python -m bench dspark` measures.
CHAIN_SETTINGS = PARALLEL


def chain_config(**kwargs):
    """A DSparkConfig with CHAIN_SETTINGS under the given fields."""
    from decoding.core.config import DSparkConfig

    return DSparkConfig(**{**CHAIN_SETTINGS, **kwargs})


# The same settings as the app's query parameters.
APP_CHAIN = {k: str(v) for k, v in CHAIN_SETTINGS.items() if k != "drafter"}


def as_draft_model_source(target: LM, draft: LM) -> str:
    """The drafter name `model:NAME` for `draft` (an LM of the target's vocabulary), without files: it is
    held as the target's draft model source, where loading `model:NAME` would keep it."""
    target.loaded(("draft model source",), draft.name, lambda: draft)
    return f"model:{draft.name}"


def random_head(lm, seed: int = 0, vocab=None, **kw) -> FeatureLatticeDrafter:
    torch.manual_seed(seed)
    hidden = int(lm.model.config.hidden_size)
    net = FeatureNet(FeatureShape(hidden, width=16, mlp=32, blocks=1), vocab or range(lm.vocab_size))
    torch.nn.init.normal_(net.out.weight, std=0.5)
    net.attach(lm).eval().requires_grad_(False)
    return FeatureLatticeDrafter(net, **kw)


class Recorder:
    """Wraps DSparkDecoder.round: keeps each round's history (hidden rows, tokens, position) and hands
    the round an oracle lookup chain (the greedy continuation's next 3 tokens, strongly scored), so
    rounds accept several drafts and the history is refilled from multi-token rounds."""

    def __init__(self, real, prompt, greedy):
        self.real, self.prompt, self.greedy, self.calls = real, prompt, greedy, []

    def __call__(self, decoder, step):
        self.calls.append((step.hidden.clone(), list(step.history), step.position))
        done = step.position - len(self.prompt)
        oracle = tuple(self.greedy[done:done + min(step.gamma, 3)])
        lookup = LookupInput(oracle, None, (0.99, 0.99)) if step.gamma >= 1 and oracle else None
        return self.real(decoder, dataclasses.replace(step, lookup=lookup))

    def install(self, monkeypatch) -> Recorder:
        """Every decoder's round() goes through this recorder until monkeypatch undoes it."""
        monkeypatch.setattr(dspark.DSparkDecoder, "round", lambda decoder, step: self(decoder, step))
        return self


SETTINGS = TrainSettings(gamma_max=6, rank=8, trunk=32, width=32, steps=120, batch_size=64, lr=1e-2,
                         answer_tokens=20, gen_batch=8, heldout_every=4)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [[rng.randrange(64) for _ in range(rng.randint(1, 7))] for _ in range(16)]
