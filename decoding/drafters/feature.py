"""Drafters over the target's own LM-head input (the net in decoding.drafters.feature_net): the plain one
drafts from the last row it was handed, the attending one over a cache of the context's rows."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.lattice import ChainDraw, Proposal, SourceRequest
from decoding.drafters.base import draft_probs, pick
from decoding.drafters.lattice_source import LatticeSource
from decoding.drafters.shallow import full_vocabulary
from decoding.runtime.models import LM


class FeatureDrafter(LatticeSource):
    """Drafts from the target's own LM-head input (decoding.drafters.feature_net): the verifier hands it the h_t that
    produced the context's last token (`observe`); a round whose context it has no h_t for drafts
    nothing (the first round, after the prompt). It keeps no cache, so rollback is free. It answers a chain
    request with its chain and q_draft rows, a tree request with nothing (DSpark's feature head is
    decoding.drafters.feature_lattice)."""

    draws_chains = True
    reads_target = True

    def __init__(self, net):
        self.net = net
        self.name = getattr(net, "name", "feature")
        self._head: torch.Tensor | None = None
        self._at = -1

    def start(self, prompt_ids: Sequence[int]) -> None:
        self._head, self._at = None, -1

    def observe(self, head_input: torch.Tensor, context_length: int) -> None:
        """The target's LM-head input (H,) that produced the last token of the context of `context_length`
        tokens (taken from the verification forward)."""
        self._head, self._at = head_input, context_length

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:
        """Only the last row is kept (`observe`): the one that produced the context's last token."""
        self.observe(rows[-1], first_position + len(rows) + 1)

    def _ready(self, context: Sequence[int]) -> bool:
        return self._head is not None and self._at == len(context)

    def _first(self, context: Sequence[int]) -> torch.Tensor:
        """The predicted LM-head input that drafts the first token (H,)."""
        feature = self._head.to(device=self.net.head.device, dtype=self.net.dtype)
        return self._advance(feature, int(context[-1]))

    def _advance(self, feature: torch.Tensor, token: int) -> torch.Tensor:
        """The next predicted LM-head input after drafting `token` from `feature` (H,)."""
        return self.net.step(feature, torch.tensor(token, device=feature.device))

    @torch.inference_mode()
    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        chain = request.chain
        if chain is None:
            return Proposal()
        if request.gamma < 1 or not self._ready(context):
            return Proposal((), source=self.name)
        feature = self._first(context)
        if chain.greedy:
            return self._propose_greedy(feature, request.gamma, chain)
        tokens, rows, draws = [], [], []
        for i in range(request.gamma):
            if i:
                feature = self._advance(feature, tokens[-1])
            logits = self.net.full_logits(feature).float()             # (V,)
            q_draft = draft_probs(logits, chain)
            picked, draw = pick(logits, q_draft, chain)
            tokens.append(picked), rows.append(q_draft), draws.append(draw)
            if picked in self.net.eos_ids or (
                    chain.stop_below is not None and float(q_draft[picked]) < chain.stop_below):
                break
        return Proposal(tuple(tokens), torch.stack(rows), tuple(draws), source=self.name)

    def _propose_greedy(self, feature: torch.Tensor, max_tokens: int, chain: ChainDraw) -> Proposal:
        """Temperature 0: each token is the argmax over the slice (the full-vocabulary argmax, −inf
        elsewhere); q_draft, softmax over the slice, is spread to the full vocabulary once for all rows."""
        tokens, rows = [], []
        for i in range(max_tokens):
            if i:
                feature = self._advance(feature, tokens[-1])
            small = self.net.slice_logits(feature).float()                   # (V_s,)
            at = torch.argmax(small)
            tokens.append(int(self.net.vocab_ids[at])), rows.append(small)
            if tokens[-1] in self.net.eos_ids or (
                    chain.stop_below is not None and float(small.softmax(-1)[at]) < chain.stop_below):
                break
        q_draft = full_vocabulary(torch.stack(rows), self.net.vocab_ids, self.net.vocab_size).softmax(-1)  # (n, V)
        return Proposal(tuple(tokens), q_draft, (None,) * len(tokens), source=self.name)

    def token_ms(self, target: LM) -> dict[str, float]:
        """Timed once per loaded net (kept on the net; seven target forwards and 35 drafted tokens):
        see _time_feature_token."""
        if getattr(self.net, "token_ms", None) is None:
            self.net.token_ms = _time_feature_token(self.net, target)
        return {self.name: self.net.token_ms}


class AttendingDrafter(FeatureDrafter):
    """A feature drafter whose net attends over the context (decoding.drafters.feature_net, shape.heads > 0). It keeps
    the target's LM-head input of every context position (handed over by `observe_rows`) and the keys and
    values of the input pairs (f_t, x_{t+1}) it has read; each round it reads the new pairs in one batch,
    then drafts one token per step. Draft steps' keys are never stored, so rollback costs nothing. A
    context whose rows it does not hold (the first round, a gap) drafts nothing."""

    def __init__(self, net):
        super().__init__(net)
        self.start(())

    def start(self, prompt_ids: Sequence[int]) -> None:
        self._rows: list[torch.Tensor] = []     # (m, H) blocks: f_0, f_1, ... in order
        self._known = 0                         # positions with a row
        self._keys = self._values = None        # (h, n_read, d)
        self._read = 0                          # pairs read into the cache: indices 0 .. _read − 1

    def observe(self, head_input: torch.Tensor, context_length: int) -> None:
        self.observe_rows(head_input[None], context_length - 2)

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:
        if first_position != self._known:       # not the next rows: start over from these if they begin at 0
            self.start(())
            if first_position != 0:
                return
        self._rows.append(rows.to(device=self.net.head.device, dtype=self.net.dtype))
        self._known += len(rows)

    def _ready(self, context: Sequence[int]) -> bool:
        return self._known >= len(context) - 1 and len(context) >= 2

    def _first(self, context: Sequence[int]) -> torch.Tensor:
        feature, self._draft_kv = self._read_context(context)
        return feature

    def _advance(self, feature: torch.Tensor, token: int) -> torch.Tensor:
        """One context step on the drafted pair; its key and value live for this proposal only."""
        keys, values = self._draft_kv
        nxt, k, v = self.net.context_step(feature[None], torch.tensor([token], device=feature.device), keys, values)
        self._draft_kv = (torch.cat([keys, k], 1), torch.cat([values, v], 1))
        return nxt[0]

    def _read_context(self, context: Sequence[int]):
        """Read pairs _read .. len(context) − 2 into the cache; -> (predicted f_{L−1}, (keys, values))."""
        end = len(context) - 1
        rows = torch.cat(self._rows) if len(self._rows) > 1 else self._rows[0]
        self._rows = [rows]
        if self._read >= end:
            return self._next, (self._keys, self._values)
        features = rows[self._read:end]
        tokens = torch.tensor(list(context[self._read + 1:end + 1]), device=rows.device)
        pred, k, v = self.net.context_step(features, tokens, self._keys, self._values)
        self._keys = k if self._keys is None else torch.cat([self._keys, k], 1)
        self._values = v if self._values is None else torch.cat([self._values, v], 1)
        self._read, self._next = end, pred[-1]
        return self._next, (self._keys, self._values)


def _time_feature_token(net, target: LM, rounds: int = 6, steps: int = 5) -> float:
    """ms per drafted token as a round meets it: a proposal of `steps` tokens right after a 1-token target
    forward (which has pushed the drafter's weights out of the CPU's caches); the median over `rounds`
    after a warm-up."""
    import statistics
    import time

    feature = torch.zeros(net.shape.hidden_size, dtype=net.dtype, device=net.head.device)
    token = torch.tensor(0, device=feature.device)
    if net.attends:                          # one draft step over a cache of 128 context pairs
        cache = torch.zeros(net.shape.heads, 128, net.shape.head_dim, dtype=feature.dtype, device=feature.device)
        advance = lambda: net.context_step(feature[None], token[None], cache, cache)[0][0]
    else:
        advance = lambda: net.step(feature, token)
    kv = target.sequence_cache()
    target.forward([0] * 8, kv)
    times = []
    with torch.inference_mode():
        for _ in range(rounds + 1):
            target.forward([0], kv)
            start = time.perf_counter()
            for _ in range(steps):
                int(net.slice_logits(advance()).argmax())
            times.append((time.perf_counter() - start) * 1000.0 / steps)
    return statistics.median(times[1:])
