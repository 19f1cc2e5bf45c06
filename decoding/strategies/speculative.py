"""Speculative decoding: a drafter proposes up to gamma tokens, ONE target forward scores them all,
an exact acceptance rule keeps a prefix, a residual (or bonus) token follows, and both KV caches are
rolled back to the accepted length.

The acceptance rules live in decoding/core/acceptance.py (their list forms, for exact enumeration, in
decoding/core/exact_rules.py); the γ policies in decoding/strategies/adaptive_gamma.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from decoding.core.acceptance import (
    accepted_mass,
    greedy_accepts,
    ratio_accepts,
    residual_distribution,
    target_argmax,
)
from decoding.core.acceptance import residual as point_mass_residual  # the one zero-and-renormalize rule
from decoding.core.config import SpeculativeConfig
from decoding.core.draft_names import LOOKUP
from decoding.core.formulas import cut_at_eos
from decoding.core.lattice import Proposal
from decoding.core.processors import Pipeline, build_pipeline
from decoding.core.token_step import row_entropies, sample_inverse_cdf
from decoding.core.trace import (
    Candidate,
    DraftingInfo,
    DraftPosition,
    GammaChoiceInfo,
    KVMemory,
    ProbEntry,
    SpecRound,
)
from decoding.core.trace_check import draft_verdict
from decoding.core.trace_totals import spec_metrics
from decoding.drafters.base import DraftRequest
from decoding.drafters.lattice_source import LatticeSource
from decoding.drafters.memory import SourceMemory
from decoding.drafters.resolve import resolve
from decoding.drafters.source_chain import composed
from decoding.runtime.hooks import tap_decoder_rows
from decoding.runtime.kv_rollback import check_architecture, roll_back
from decoding.runtime.models import LM, Timer, kv_memory
from decoding.strategies.adaptive_gamma import GammaPolicy, make_policy

# ---------------------------------------------------------------- one round

@dataclass(frozen=True)
class _Verdicts:
    accepted: int
    us: tuple[float | None, ...]        # draws made for the verified positions
    final_id: int
    final_draw: float | None
    final_kind: str                     # residual | bonus
    residual: torch.Tensor | None       # (V,) the residual sampled from at a T>0 rejection


class Speculator:
    """Runs speculative rounds for one trace; owns the target KV cache and talks to the drafter's sources
    through their composer."""

    def __init__(self, lm: LM, config: SpeculativeConfig, drafter: LatticeSource,
                 generator: torch.Generator, info: DraftingInfo | None = None):
        self.lm, self.config, self.drafter, self.generator = lm, config, composed(drafter), generator
        self.info = info                          # which sources run and why: on the first round's event
        self.greedy = config.is_greedy
        self.pipeline = Pipeline(()) if self.greedy else build_pipeline(
            config.temperature, config.top_k, config.top_p, config.min_p)
        self.cache = lm.sequence_cache(rollback=True)
        self.cached = 0                           # positions held by the target cache
        self.last_fed = 0                         # tokens in the latest target forward
        self.policy: GammaPolicy | None = None                    # made by rounds(): "cost" profiles there
        self.head_rows: torch.Tensor | None = None               # (fed, H) LM-head inputs of the last verify
        self.cached_before = 0                                    # the first position the last verify fed

    def rounds(self, prompt_ids: list[int], forced: list[int]) -> Iterator[SpecRound]:
        self.policy = make_policy(self.config, self.lm, self.drafter)   # profiling runs where the steps run
        self.drafter.start(prompt_ids)
        context, produced, forced_now = list(prompt_ids) + forced, 0, tuple(forced)
        index = 0
        while produced < self.config.max_new_tokens and len(context) < self.lm.context_length:
            budget = self.config.max_new_tokens - produced - len(forced_now)
            if any(t in self.lm.eos_ids for t in forced_now):
                budget = 0                        # a forced EOS ends the answer: nothing after it
            event = self.round(index, context, forced_now, budget)
            if index == 0:
                event = dataclasses.replace(event, drafting=self.info)
            yield event
            new = event.emitted[len(forced_now):]
            context, produced = context + list(new), produced + len(event.emitted)
            if any(t in self.lm.eos_ids for t in event.emitted) or event.final_kind == "none":
                return
            index, forced_now = index + 1, ()

    def round(self, index: int, context: list[int], forced_now: tuple[int, ...], budget: int) -> SpecRound:
        """draft -> verify (one target forward) -> accept -> roll back both caches -> the event."""
        timer = Timer(self.lm)
        pick = self.policy.pick(self.drafter.source_for(context))
        cap = max(0, min(budget - 1, self.lm.context_length - len(context) - 1))
        proposal = self._draft(context, min(pick.gamma, cap), cap)
        timer.lap("draft")
        n_verify, reason = self._verified_count(proposal, pick.gamma, min(pick.gamma, cap), pick.reason)
        raw = self._verify(context, proposal)                     # (n+1, V)
        timer.lap("verify")
        peak = kv_memory(self.cache).bytes
        processed = self.pipeline(raw)                            # (n+1, V)
        p_target = processed.softmax(-1)                          # (n+1, V)
        verdicts = self._accept(raw, p_target, proposal, n_verify)
        timer.lap("accept")
        new = self._new_tokens(proposal, verdicts, budget)
        cropped = self._roll_back_caches(context + list(new))
        timer.lap("rollback")
        drafter = proposal.source or self.drafter.name
        self.policy.update(drafter, n_verify, verdicts.accepted)
        return spec_event(self.lm, self.config, SpecResult(
            index=index, position=len(context) - len(forced_now), forced=tuple(forced_now), drafter=drafter,
            reason=reason, choice=pick.choice, proposal=proposal, n_verify=n_verify, processed=processed,
            p_target=p_target, verdicts=verdicts, new=new, cropped=cropped, fed=self.last_fed, timer=timer,
            kv=kv_memory(self.cache, peak_bytes=peak), raw=raw))

    # -- drafting
    def _draft(self, context: list[int], n_verify: int, cap: int) -> Proposal:
        n_total = max(n_verify, min(self.config.gamma_max, cap))
        if n_total == 0:
            return Proposal(())
        stop = self.policy.threshold if n_total == n_verify else None      # the confidence stop, if any
        request = DraftRequest(n_total, self.pipeline, self.greedy, self.generator, stop)
        return self.drafter.propose(context, request)

    def _verified_count(self, proposal: Proposal, gamma: int, n_verify: int, reason: str) -> tuple[int, str]:
        """Drafts to verify after the budget cap, what the drafter had, and the policy's cut (confidence)."""
        if n_verify < gamma:
            reason += f"; capped to {n_verify} by the token budget/context"
        if len(proposal) < n_verify:
            reason += f"; the drafter proposed {len(proposal)}" + (" (no n-gram match)" if (
                self.drafter.name == LOOKUP and not proposal.tokens) else "")
        n_verify = min(n_verify, len(proposal))
        if self.policy.threshold is None or proposal.q_draft is None or n_verify == 0:
            return n_verify, reason
        rows = torch.arange(n_verify, device=proposal.q_draft.device)
        q_own = proposal.q_draft[rows, torch.tensor(proposal.tokens[:n_verify], device=rows.device)]  # (n,)
        cut, why = self.policy.cut(q_own.tolist())
        return cut, reason + why

    # -- verification: one target forward over the pending tokens and every drafted token
    def _verify(self, context: list[int], proposal: Proposal) -> torch.Tensor:
        feed = context[self.cached:] + list(proposal.tokens)
        self.cached_before = self.cached
        with tap_decoder_rows(self.lm) if self.drafter.reads_target else nullcontext() as tap:
            logits = self.lm.forward(feed, self.cache, logits_to_keep=len(proposal) + 1)  # (n+1, V)
        if tap is not None:
            self.head_rows = tap.rows[0]                                                 # (fed, H)
        self.cached += len(feed)
        self.last_fed = len(feed)
        self.drafter.observe_logits(feed[len(feed) - len(logits):], logits)
        return logits

    # -- acceptance (decoding/core/acceptance.py)
    def _accept(self, raw: torch.Tensor, p_target: torch.Tensor, proposal: Proposal, n_verify: int) -> _Verdicts:
        us: list[float | None] = []
        for k in range(n_verify):
            token = proposal.tokens[k]
            if self.greedy:
                ok, u = greedy_accepts(token, raw[k]), None
            else:
                q_x = 1.0 if proposal.q_draft is None else float(proposal.q_draft[k, token])
                ok, u = ratio_accepts(float(p_target[k, token]), q_x, self.generator)
            us.append(u)
            if not ok:
                return self._final(k, us, raw[k], self._residual(p_target[k], proposal, k), "residual")
        return self._final(n_verify, us, raw[n_verify], p_target[n_verify], "bonus")

    def _residual(self, p_row: torch.Tensor, proposal: Proposal, k: int) -> torch.Tensor | None:
        """(V,) what to draw from after draft k was rejected (None at temperature 0)."""
        if self.greedy:
            return None
        if proposal.q_draft is None:
            return point_mass_residual(p_row, proposal.tokens[k])
        return residual_distribution(p_row, proposal.q_draft[k])

    def _final(self, accepted: int, us: list, raw_row: torch.Tensor, dist, kind: str) -> _Verdicts:
        """The token after the accepted drafts: the target's argmax at temperature 0, else a draw from `dist`."""
        if self.greedy:
            return _Verdicts(accepted, tuple(us), target_argmax(raw_row), None, kind, None)
        token, draw = sample_inverse_cdf(dist, self.generator)
        return _Verdicts(accepted, tuple(us), token, draw, kind, dist if kind == "residual" else None)

    def _new_tokens(self, proposal: Proposal, verdicts: _Verdicts, budget: int) -> tuple[int, ...]:
        """Accepted drafts + the final token, cut after an EOS and at the token budget."""
        new = list(proposal.tokens[:verdicts.accepted]) + [verdicts.final_id]
        return cut_at_eos(new, self.lm.eos_ids, budget)

    # -- rollback
    def _roll_back_caches(self, kept_context: list[int]) -> tuple[int, int]:
        """Both caches back to `kept_context`; the drafter sees the target rows it kept.
        -> (positions cropped from the target cache, from the drafter's)."""
        cropped = self._rollback(kept_context)
        cropped_draft = self.drafter.rollback(kept_context)
        kept_rows = len(kept_context) - 1 - self.cached_before     # up to the row that produced the last kept token
        if self.head_rows is not None and kept_rows > 0:
            self.drafter.observe_rows(self.head_rows[:kept_rows], self.cached_before)
        return cropped, cropped_draft

    def _rollback(self, kept_context: list[int]) -> int:
        removed = max(self.cached - (len(kept_context) - 1), 0)
        roll_back(self.cache, self.cached - removed)      # also trims sliding-window layers to their window
        self.cached -= removed
        return removed


# ---------------------------------------------------------------- the round's result and its event

@dataclass(frozen=True)
class SpecResult:
    """What one round did, for the trace."""

    index: int
    position: int                       # absolute position of the round's first emitted token
    forced: tuple[int, ...]             # forced tokens emitted first
    drafter: str                        # the drafter that drafted this round
    reason: str                         # why this γ
    choice: GammaChoiceInfo | None      # gamma_policy "cost": how γ was chosen
    proposal: Proposal
    n_verify: int                       # drafts verified (after caps and stops)
    processed: torch.Tensor             # (n+1, V) the target's processed logits
    p_target: torch.Tensor              # (n+1, V) their softmax
    verdicts: _Verdicts
    new: tuple[int, ...]                # tokens emitted after the forced ones
    cropped: tuple[int, int]            # positions cropped from the target cache, the drafter's
    fed: int                            # tokens in the target forward
    timer: Timer                        # read (done) when the event is built
    kv: KVMemory | None = None          # the target cache at its peak and after the rollback
    raw: torch.Tensor | None = None     # (n+1, V) the target's raw logits (their entropies go in the trace)


def spec_event(lm: LM, config: SpeculativeConfig, result: SpecResult) -> SpecRound:
    """The trace event of one round."""
    target_tops = top_rows(lm, result.processed, result.p_target, config.top_n)      # n+1 rows
    drafts = draft_positions(lm, config.top_n, result, target_tops)
    verdicts, new = result.verdicts, result.new
    kind = verdicts.final_kind if verdicts.final_id in new[verdicts.accepted:] else "none"
    return SpecRound(
        index=result.index, position=result.position, drafter=result.drafter, gamma=result.n_verify,
        gamma_policy=config.gamma_policy, gamma_reason=result.reason, drafts=drafts,
        accepted=verdicts.accepted, final_kind=kind,
        final_id=verdicts.final_id if kind != "none" else None, final_draw=verdicts.final_draw,
        final_top=target_tops[verdicts.accepted],
        residual_top=residual_top(lm, config.top_n, verdicts.residual), emitted=result.forced + tuple(new),
        forced_ids=result.forced, fed_tokens=result.fed, kv_cropped_target=result.cropped[0],
        kv_cropped_draft=result.cropped[1], lookup=result.proposal.lookup, timings_ms=result.timer.done(),
        final_piece=lm.piece(verdicts.final_id) if kind != "none" else "", gamma_choice=result.choice,
        kv=result.kv)


def draft_positions(lm: LM, top_n: int, result: SpecResult, target_tops) -> tuple[DraftPosition, ...]:
    """Every drafted position's numbers, each kind gathered for all positions at once."""
    proposal, p_target, verdicts = result.proposal, result.p_target, result.verdicts
    n = len(proposal)
    if n == 0:
        return ()
    rows = torch.arange(n, device=p_target.device)
    tokens = torch.tensor(proposal.tokens, device=p_target.device)
    p_x = p_target[rows, tokens].tolist()                                          # (n,)
    q_draft = proposal.q_draft
    entropies = row_entropies(result.raw[:n]) if result.raw is not None else [None] * n
    if q_draft is None:
        q_x, masses, draft_tops = [None] * n, p_x, [()] * n
    else:
        q_draft = q_draft.to(p_target.device)
        q_x = q_draft[rows, tokens].tolist()                                      # (n,)
        masses = accepted_mass(p_target[:n], q_draft).tolist()                    # (n,)
        draft_tops = top_rows(lm, None, q_draft, top_n)                           # logits = log q
    return tuple(DraftPosition(
        index=k, token_id=token, piece=lm.piece(token), q_draft=q_x[k], p_target=p_x[k],
        ratio=p_x[k] / q_x[k] if q_x[k] else p_x[k], accept_prob=masses[k],
        u=verdicts.us[k] if k < len(verdicts.us) else None,
        verdict=draft_verdict(k, result.n_verify, verdicts.accepted),
        draft_draw=proposal.draft_draws[k] if k < len(proposal.draft_draws) else None,
        target_top=target_tops[k], draft_top=draft_tops[k], target_entropy=entropies[k])
        for k, token in enumerate(proposal.tokens))


def residual_top(lm: LM, top_n: int, residual: torch.Tensor | None) -> tuple[ProbEntry, ...]:
    if residual is None:
        return ()
    top = torch.topk(residual, min(top_n, residual.shape[-1]))
    return tuple(ProbEntry(int(t), lm.piece(int(t)), float(p))
                 for t, p in zip(top.indices.tolist(), top.values.tolist()) if p > 0)


def top_rows(lm, logits: torch.Tensor | None, probs: torch.Tensor, top_n: int) -> list[tuple[Candidate, ...]]:
    """The top-N candidates of every row of (R, V) `probs`, with their `logits` (None: log probs), found
    with one topk and read back with one transfer per field."""
    top = torch.topk(probs, min(top_n, probs.shape[-1]), dim=-1).indices               # (R, N)
    prob_rows = probs.gather(-1, top)                                                  # (R, N)
    logit_rows = torch.log(prob_rows) if logits is None else logits.gather(-1, top)    # (R, N)
    return [tuple(Candidate(t, lm.piece(t), lg, pr) for t, lg, pr in zip(ids, lgs, prs))
            for ids, lgs, prs in zip(top.tolist(), logit_rows.tolist(), prob_rows.tolist())]


# ---------------------------------------------------------------- strategy entry points

def decode(lm: LM, prompt_ids: Sequence[int], config: SpeculativeConfig, *, generator: torch.Generator,
           forced: Sequence[int] = (), drafter=None, memory: SourceMemory | None = None) -> Iterator[SpecRound]:
    """Yield one SpecRound per target forward. `drafter`: as in DSpark, a source (the run's drafter as given:
    a LatticeSource, or sources behind their SourceChainDrafter) or the draft loaded for the config's `draft`
    name (an LM, or a FeatureNet from load_draft; None: the run loads what the name needs), resolved by
    decoding.drafters.resolve here, as DSpark's is, so a bad one fails at this call, before the first round.
    Token recycling and suffix matching draft from `memory` (None: an empty one of this run's own)."""
    check_architecture(lm, config.strategy)
    drafting = resolve(lm, config, drafter, memory)
    forced = [int(t) for t in forced][:config.max_new_tokens]
    return Speculator(lm, config, drafting.chain, generator, drafting.info).rounds(list(prompt_ids), forced)


def spec_stats(events: Sequence) -> dict:
    """vLLM's definitions (decoding.core.trace_totals.spec_metrics) over the speculative rounds."""
    return spec_metrics([e for e in events if isinstance(e, SpecRound)])
