"""A draft model with the target's vocabulary drafting token by token on its own KV cache; the untrained
early-exit draft (the target's first layers) for comparisons."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.errors import check
from decoding.core.lattice import Proposal, SourceRequest
from decoding.drafters.base import draft_probs, pick
from decoding.drafters.lattice_source import LatticeSource
from decoding.runtime.kv_rollback import architecture, roll_back, rollback_problem
from decoding.runtime.models import LM


def check_compatible(draft: LM, target: LM) -> None:
    """Refuse a draft whose vocabulary size or tokenizer differs from the target's."""
    check(draft.vocab_size == target.vocab_size, "draft", draft.name,
          f"has a vocabulary of {draft.vocab_size} tokens, the target has {target.vocab_size}")
    tok_d, tok_t = draft.tokenizer, target.tokenizer
    if tok_d is tok_t:
        return
    check(tok_d is not None and tok_t is not None, "draft", draft.name,
          "has a tokenizer and the target has none (or the reverse)")
    check(len(tok_d) == len(tok_t) and tok_d.get_vocab() == tok_t.get_vocab(), "draft", draft.name,
          "uses a different tokenizer from the target's")


class DraftModelDrafter(LatticeSource):
    """Any causal LM with the target's vocabulary, with its own KV cache: answers a chain request with its
    chain and q_draft rows (a tree request with nothing; its tree is decoding.drafters.model_source's)."""

    draws_chains = True

    def __init__(self, draft: LM, target: LM | None = None):
        if target is not None:
            check_compatible(draft, target)
        problem = rollback_problem(draft.model)
        check(problem is None, "draft", draft.name, f"cannot draft on {architecture(draft.model)} models: {problem}")
        self.lm = draft
        self.name = draft.name
        self.cache = None
        self.fed: list[int] = []

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.cache, self.fed = self.lm.sequence_cache(rollback=True), []

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        chain = request.chain
        if chain is None:
            return Proposal()
        if self.cache is None:
            self.start(context)
        logits = self._catch_up(list(context))  # (V,)
        tokens, rows, draws = [], [], []
        for i in range(request.gamma):
            q_draft = draft_probs(logits, chain)  # (V,)
            token, draw = pick(logits, q_draft, chain)
            tokens.append(token), rows.append(q_draft), draws.append(draw)
            stop = chain.stop_below is not None and float(q_draft[token]) < chain.stop_below
            if stop or token in self.lm.eos_ids or i == request.gamma - 1:
                break
            logits = self._feed([token])
        q = torch.stack(rows) if rows else None  # (n, V)
        return Proposal(tuple(tokens), q, tuple(draws), source=self.name)

    def rollback(self, context: Sequence[int]) -> int:
        keep = _common_prefix(self.fed, context)
        return self._crop_to(keep)

    def token_ms(self, target: LM) -> dict[str, float]:
        """Profiled once per device and cached (decoding.runtime.cost_table)."""
        from decoding.runtime.cost_table import draft_token_ms

        return {self.name: draft_token_ms(target, self.lm)[0]}

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        keep = min(_common_prefix(self.fed, context), len(context) - 1)
        self._crop_to(keep)
        return self._feed(context[keep:])

    def _feed(self, ids: list[int]) -> torch.Tensor:
        self.fed.extend(ids)
        return self.lm.forward(ids, self.cache, logits_to_keep=1)[-1]  # (V,)

    def _crop_to(self, keep: int) -> int:
        removed = max(len(self.fed) - keep, 0)
        roll_back(self.cache, len(self.fed) - removed)      # also trims sliding-window layers to their window
        del self.fed[len(self.fed) - removed:]
        return removed


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def truncated_draft(target: LM, num_layers: int, name: str | None = None) -> LM:
    """An untrained early-exit draft: the target's first `num_layers` layers + final norm + LM head,
    as a standard transformers model sharing the target's weights (no copy) and its lock."""
    import copy

    model = target.model
    layers = model.model.layers
    check(isinstance(num_layers, int) and 1 <= num_layers <= len(layers), "draft_layers", num_layers,
          f"must be an integer in [1, {len(layers)}]")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = type(model)(config)
    draft.model.embed_tokens = model.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(layers[:num_layers])
    draft.model.norm = model.model.norm
    draft.model.rotary_emb = model.model.rotary_emb
    draft.lm_head = model.lm_head
    draft.generation_config = copy.deepcopy(model.generation_config)
    draft.eval()
    return LM(draft, target.tokenizer, name=name or f"{target.name}[:{num_layers}]", device=target.device,
              lock=target.lock)


