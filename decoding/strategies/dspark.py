"""Parallel drafting ("DSpark", Cheng et al. 2026), exact: per round one drafter pass over the target's
hidden states at the last emitted tokens gives a lattice of γ positions × K candidates; stage 1 (draft
side only) picks a chain (DP) or a tree (best-first), cost-aware when a verify-cost table is given;
stage 2 verifies it in ONE target forward (tree mask) and applies the exact acceptance rule; the KV
cache keeps the accepted path only. The hidden states for the next round come from that same forward.

Round r's tree: node 0 is the last emitted token (not yet in the cache), nodes 1.. the drafts."""
from __future__ import annotations

import dataclasses
import statistics
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from decoding.core.acceptance import RoundOutcome, greedy_round, sample_round
from decoding.core.config import AUTO_COST, DSparkConfig
from decoding.core.formulas import cut_at_eos, survival
from decoding.core.lattice import LatticeDraft, LookupInput, SourceRequest
from decoding.core.processors import build_pipeline
from decoding.core.token_step import row_entropies, sample_inverse_cdf
from decoding.core.trace import (
    ChainDP,
    DSparkRound,
    KVMemory,
    LatticeCell,
    LatticeColumn,
    PlanNode,
    SizeChoiceInfo,
)
from decoding.core.trace_totals import dspark_metrics
from decoding.drafters.lattice_lookup import LookupRate, continuation, hits, lookup_nodes
from decoding.drafters.lattice_source import SourceSet
from decoding.drafters.memory import SourceMemory
from decoding.drafters.resolve import Drafting, resolve
from decoding.runtime.cost_table import CostTable, load_table, probe_ids
from decoding.runtime.hooks import tap_head_input
from decoding.runtime.kv_rollback import check_architecture
from decoding.runtime.models import LM, Timer, kv_memory
from decoding.strategies.dspark_select import (
    ChainPlan,
    SizeChoice,
    TreePlan,
    best_chain,
    best_tree,
    choose_chain,
    choose_tree,
    flat_tree,
)
from decoding.strategies.tree_verify import compact_cache, depths, verify_tree


# ------------------------------------------------------------------------------ set-up
def load_cost(lm: LM, config: DSparkConfig, drafter: Drafting) -> CostTable | None:
    """None (fixed size), the table in config.cost_table, or for "auto" the table profiled on this
    device on first use and cached (profiled again when it covers too few tokens), with this drafter's
    round overhead (`round_overhead_ms`)."""
    if config.cost_table is None:
        return None
    table = load_table(lm, config.cost_table, config.cost_need())
    if config.cost_table != AUTO_COST:
        return table
    return dataclasses.replace(table, overhead_ms=round_overhead_ms(lm, config, drafter, table))


OVERHEAD_TEXT = "Explain in a few sentences why the sea is salty, and where the salt comes from."
OVERHEAD_TOKENS = 24               # tokens decoded to time the rounds
_overheads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # drafter or model -> {round shape: ms}


def round_overhead_ms(lm: LM, config: DSparkConfig, drafter: Drafting, table: CostTable) -> float:
    """Milliseconds a round with this drafter spends outside its verification forward (drafting,
    selection, acceptance, cache compaction): the median over the drafting rounds of a short run of this
    config (seed 0, sized without overhead) on a fixed prompt (`_probe_prompt`), timed once per trained
    net the sources wrap (Drafting.timing_key; the model, without one), model, device, fast path or not,
    sources and round shape (γ, K, budget, lookup, greedy or not)."""
    shape = (lm.name, str(lm.device), str(lm.dtype), lm.fast is not None, config.select, config.gamma,
             config.top_k_candidates, config.budget, config.lookup_max_ngram, config.is_greedy,
             drafter.info.sources)
    known = _overheads.setdefault(drafter.timing_key if drafter.timing_key is not None else lm, {})
    if shape not in known:
        probe = dataclasses.replace(config, max_new_tokens=OVERHEAD_TOKENS, cost_table=None)
        decoder = DSparkDecoder(lm, probe, drafter, torch.Generator().manual_seed(0),
                                dataclasses.replace(table, overhead_ms=0.0))
        decoder.prefill(_probe_prompt(lm), ())
        outside = [sum(ms for phase, ms in event.timings_ms.items() if phase != "verification")
                   for event in decoder.rounds() if event.lattice]
        if not outside:                    # the probe ended before drafting: no estimate, none kept
            return 0.0
        known[shape] = statistics.median(outside)
    return known[shape]


def _probe_prompt(lm: LM) -> list[int]:
    """OVERHEAD_TEXT in the chat template; a model without a tokenizer (the tests' tiny ones) gets fixed ids."""
    if lm.tokenizer is None:
        return probe_ids(lm, 32)
    return lm.encode(OVERHEAD_TEXT)


def target_probs(logits: torch.Tensor, pipeline) -> torch.Tensor:
    """Processed target distribution per row (q, V); plain softmax at temperature 0 (for display)."""
    return torch.softmax(logits if pipeline is None else pipeline(logits), -1)


# ------------------------------------------------------------------------------ stage 1
def select_plan(lattice, config: DSparkConfig, cost: CostTable | None):
    """(plan, size choice or None): chain DP or best-first tree, cost-aware with a table."""
    if config.select == "chain":
        if cost is None:
            return best_chain(lattice), None
        return choose_chain(lattice, cost, cost.overhead_ms)
    if cost is None:
        return best_tree(lattice, config.budget), None
    return choose_tree(lattice, cost, config.budget, cost.overhead_ms)


def source_nodes(config: DSparkConfig) -> int:
    """The most candidates a tree source proposes in a round: twice what the plan may verify, at most 32."""
    most = config.budget if config.select == "tree" else config.gamma * config.top_k_candidates
    return min(32, 2 * most)


# ------------------------------------------------------------------------------ one round
@dataclass(frozen=True)
class RoundStep:
    """What one round starts from."""

    index: int
    position: int                      # absolute position of the round's first emitted token
    room: int                          # tokens the answer may still add
    gamma: int                         # draft positions (0: a plain step)
    history: Sequence[int]             # the last emitted tokens, the root (node 0) last
    hidden: torch.Tensor               # (len(history), F) the drafter's input row that produced each
    lookup: LookupInput | None         # prompt lookup's chain (None: lookup off or no drafts)


@dataclass(frozen=True)
class RoundResult:
    """What one round did: the lattice, the plan verified as a tree, the target's verdicts."""

    draft: LatticeDraft | None         # None: a plain step
    plan: ChainPlan | TreePlan | None
    choice: SizeChoice | None          # the cost-aware size, with a cost table
    tokens: tuple[int, ...]            # verified nodes, node 0 the root
    parents: tuple[int, ...]
    p_rows: torch.Tensor               # (q, V) processed target distribution at each node
    outcome: RoundOutcome
    produced: torch.Tensor             # (1 + accepted, F) the rows that produced the emitted tokens
    timer: Timer                       # read (done) when the event is built
    kv: KVMemory | None = None         # the target cache at its peak (the tree verified) and compacted
    logits: torch.Tensor | None = None  # (q, V) the target's raw logits at each node (their entropies)


@dataclass(frozen=True)
class PrefillResult:
    position: int                      # prompt length
    forced: tuple[int, ...]            # as given
    token: int                         # the first free token
    draw: float | None
    timer: Timer
    kv: KVMemory | None = None         # the target cache after the prefill


class DSparkDecoder:
    """One trace's parallel drafting: the target KV cache, the drafter's hidden-row history (the rows
    that produced the last emitted tokens), the emitted context and prompt lookup's hit rate."""

    def __init__(self, lm: LM, config: DSparkConfig, drafting: Drafting, generator: torch.Generator,
                 cost: CostTable | None = None, cache=None):
        self.lm, self.config, self.drafting, self.generator, self.cost = lm, config, drafting, generator, cost
        self.sources = SourceSet(drafting.sources)    # the base and the tree sources, calibrated by this run
        self.pipeline = None if config.is_greedy else build_pipeline(config.temperature, config.top_k,
                                                                     config.top_p, config.min_p)
        self.cache = lm.sequence_cache(rollback=True) if cache is None else cache
        self.hidden: torch.Tensor | None = None    # (T, F): what produced each of the last T context tokens
        self.context: list[int] = []               # prompt + emitted
        self.prompt_len, self.index, self.rate = 0, 0, LookupRate()
        self.last: tuple[int, ...] = ()            # the latest event's emitted tokens

    def prefill(self, prompt_ids: Sequence[int], forced: Sequence[int]) -> DSparkRound:
        """Forward over prompt + forced tokens; choose the first free token. The history starts with
        the drafter's input row (the LM-head input, then the feature layers' outputs) at the last position."""
        timer = Timer(self.lm)
        fed = list(prompt_ids) + list(forced)
        keep = min(len(fed), max(1, self.sources.prompt_rows))
        with tap_head_input(self.lm, self.sources.feature_layers) as tap:
            rows = self.lm.forward(fed, self.cache, logits_to_keep=keep)            # (T or 1, V)
        row = rows[-1]                             # (V,)
        self.hidden = tap.hidden[0, -1][None]      # (1, F) the head reads the last position only
        timer.lap("prefill")
        self.sources.start(fed)
        self.sources.observe_logits(fed[len(fed) - len(rows):], rows)
        token, draw = self._first_token(row)
        timer.lap("acceptance")
        event = prefill_event(self.lm, self.config,
                              PrefillResult(len(prompt_ids), tuple(forced), token, draw, timer,
                                            kv_memory(self.cache)))
        event = dataclasses.replace(event, drafting=self.drafting.info)
        self.context, self.prompt_len = list(prompt_ids) + list(event.emitted), len(prompt_ids)
        self.last, self.index = event.emitted, 1
        return event

    def rounds(self) -> Iterator[DSparkRound]:
        """One DSparkRound per target forward until EOS, max_new_tokens or the context end."""
        while (step := self.next_step()) is not None:
            result = self.round(step)
            event = round_event(self.lm, self.config, self.cost, step, result)
            yield event
            self.advance(step, event.emitted, result.produced)

    def next_step(self) -> RoundStep | None:
        """The next round's inputs; None once the answer is complete or the context is full."""
        position, config = len(self.context), self.config
        done = position - self.prompt_len
        if done >= config.max_new_tokens or self.last[-1] in self.lm.eos_ids or position >= self.lm.context_length:
            return None
        room = config.max_new_tokens - done
        gamma = max(0, min(config.gamma, room - 1, self.lm.context_length - position - 1))
        history = self.context[len(self.context) - len(self.hidden):]
        return RoundStep(self.index, position, room, gamma, history, self.hidden, self._lookup(gamma))

    def round(self, step: RoundStep) -> RoundResult:
        """One target forward: draft -> select -> verify -> accept -> roll back (compact the cache)."""
        timer = Timer(self.lm)
        draft = self._draft(step) if step.gamma >= 1 else None
        if step.gamma >= 1:
            timer.lap("drafter")
        plan, choice = select_plan(draft.lattice, self.config, self.cost) if draft else (None, None)
        root = int(step.history[-1])
        tokens, parents = flat_tree(root, plan) if plan else ((root,), (-1,))
        timer.lap("dp")
        past = self.cache.get_seq_length()
        logits, rows = self._verify(tokens, parents)               # (q, V), (q, F)
        timer.lap("verification")
        self.sources.observe_logits(tokens, logits)
        timer.lap("drafter")
        peak = kv_memory(self.cache).bytes
        p_rows = target_probs(logits, self.pipeline)               # (q, V)
        outcome = self._accept(tokens, parents, logits, p_rows)
        timer.lap("acceptance")
        kept = [0] + list(outcome.accepted)
        compact_cache(self.cache, past, kept)
        timer.lap("cache")
        return RoundResult(draft, plan, choice, tokens, parents, p_rows, outcome, rows[kept], timer,
                           kv_memory(self.cache, peak_bytes=peak), logits)

    def advance(self, step: RoundStep, emitted: Sequence[int], produced: torch.Tensor) -> None:
        """After a round: the context, the history rows (at most the drafter's span) and the lookup rate."""
        self.context.extend(emitted)
        self.hidden = torch.cat([self.hidden, produced[:len(emitted)]])[-self.sources.span:]
        self.sources.learn(emitted)
        self.sources.observe_context(self.context)
        if step.lookup:
            self.rate = self.rate.updated(hits(step.lookup.tokens, emitted))
        self.last, self.index = emitted, self.index + 1

    # -- the round's parts
    def _first_token(self, row: torch.Tensor) -> tuple[int, float | None]:
        if self.pipeline is None:
            return int(torch.argmax(row)), None
        return sample_inverse_cdf(torch.softmax(self.pipeline(row), -1), self.generator)

    def _lookup(self, gamma: int) -> LookupInput | None:
        """This round's prompt-lookup input (None when lookup is off or there are no drafts)."""
        if self.config.lookup_max_ngram < 1 or gamma < 1:
            return None
        tokens, match = continuation(self.context, self.config.lookup_max_ngram, gamma, self.lm.eos_ids)
        return LookupInput(tokens, match, self.rate.scores())

    def _draft(self, step: RoundStep) -> LatticeDraft | None:
        """The round's lattice from every source (the base: the trained drafter's with prompt lookup's chain
        inside it, or lookup's chain alone; the trees composed onto it); None when nothing was proposed."""
        config = self.config
        request = SourceRequest(step.gamma, source_nodes(config), config.top_k_candidates, config.temperature,
                                config.budget if config.select == "tree" else None, step.history, step.hidden,
                                step.lookup)
        return self.sources.draft(self.context, request).lattice

    def _verify(self, tokens, parents) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (q, V) of one target forward over the tree, and the drafter's input rows (q, F)."""
        with tap_head_input(self.lm, self.sources.feature_layers) as tap:
            logits = verify_tree(self.lm, self.cache, tokens, parents)
        return logits, tap.hidden[0]

    def _accept(self, tokens, parents, logits: torch.Tensor, p_rows: torch.Tensor) -> RoundOutcome:
        if self.pipeline is None:
            return greedy_round(tokens, parents, logits)
        return sample_round(tokens, parents, p_rows, self.generator, self.config.lossy_threshold)


def decode(lm: LM, prompt_ids: Sequence[int], config: DSparkConfig, *, generator: torch.Generator,
           forced: Sequence[int] = (), drafter=None, memory: SourceMemory | None = None) -> Iterator[DSparkRound]:
    """The prefill event, then one DSparkRound per target forward until EOS, max_new_tokens or the
    context end. A model whose cache or attention cannot take the rounds is refused here, before the run.
    `drafter`: as in speculative decoding, a source (the run's drafter as given) or a loaded trained drafter
    in the place of the name's (decoding.drafters.resolve). Token recycling and suffix matching draft from
    `memory` (None: an empty one). The drafter is resolved (and loaded) here, as speculative decoding's is, so
    a bad one fails at this call, before the first event; the cost table is profiled at the first event."""
    check_architecture(lm, config.strategy, tree=config.select == "tree")
    return _events(lm, prompt_ids, config, generator, forced, resolve(lm, config, drafter, memory))


def _events(lm: LM, prompt_ids: Sequence[int], config: DSparkConfig, generator: torch.Generator,
            forced: Sequence[int], drafting: Drafting) -> Iterator[DSparkRound]:
    decoder = DSparkDecoder(lm, config, drafting, generator, load_cost(lm, config, drafting))
    yield decoder.prefill(prompt_ids, forced)
    yield from decoder.rounds()


# ------------------------------------------------------------------------------ trace events
def prefill_event(lm: LM, config: DSparkConfig, done: PrefillResult) -> DSparkRound:
    emitted = cut_at_eos(list(done.forced) + [done.token], lm.eos_ids, config.max_new_tokens)
    return DSparkRound(index=0, position=done.position, prefill=True, select=config.select, lattice=(),
                       dp=None, nodes=(), expected_accepted=0.0, size=None, accepted_path=(),
                       next_token=done.token, next_from="prefill", next_draw=done.draw, emitted=emitted,
                       lossy=config.is_lossy, forced_ids=tuple(int(t) for t in done.forced),
                       fed_tokens=done.position + len(done.forced), timings_ms=done.timer.done(),
                       next_piece=lm.piece(done.token), kv=done.kv)


def round_event(lm: LM, config: DSparkConfig, cost: CostTable | None, step: RoundStep,
                result: RoundResult) -> DSparkRound:
    draft, plan, outcome, lookup = result.draft, result.plan, result.outcome, step.lookup
    return DSparkRound(
        index=step.index, position=step.position, prefill=False, select=config.select,
        lattice=lattice_columns(lm, draft) if draft else (), dp=chain_dp(plan),
        nodes=plan_nodes(lm, result) if plan else (),
        expected_accepted=float(plan.expected_accepted) if plan else 0.0, size=size_info(cost, result.choice),
        accepted_path=outcome.accepted, next_token=outcome.next_token, next_from=outcome.next_from,
        next_draw=outcome.next_draw, emitted=cut_at_eos(outcome.emitted, lm.eos_ids, step.room),
        lossy=config.is_lossy, fed_tokens=len(result.tokens), timings_ms=result.timer.done(),
        next_piece=lm.piece(outcome.next_token), lookup=lookup.match if lookup else None,
        lookup_scores=lookup.scores if lookup else None, kv=result.kv)


def lattice_columns(lm: LM, draft: LatticeDraft) -> tuple[LatticeColumn, ...]:
    lat, cols = draft.lattice, []
    for k in range(lat.gamma):
        extra = draft.extra[k] if k < len(draft.extra) else None
        sources = draft.sources[k] if k < len(draft.sources) else ()
        cells = tuple(LatticeCell(k + 1, j, tok, lm.piece(tok), float(lat.q_draft[k][j]),
                                  tuple(float(row[j]) for row in lat.scores[k]), lookup=j == extra,
                                  sources=sources[j] if j < len(sources) else ())
                      for j, tok in enumerate(lat.token_ids[k]))
        cols.append(LatticeColumn(k + 1, draft.confidence[k], cells))
    return tuple(cols)


def chain_dp(plan) -> ChainDP | None:
    if not isinstance(plan, ChainPlan):
        return None
    values = tuple(tuple(tuple(float(v) for v in row) for row in pos) for pos in plan.values)
    return ChainDP(values, plan.back, plan.path)


def plan_scores(plan) -> tuple[Sequence, list[float], Sequence[int]]:
    """(score given its parent, survival product, candidate index) of every plan node."""
    if isinstance(plan, ChainPlan):
        return plan.scores, survival([float(s) for s in plan.scores]), plan.path
    return [n.score for n in plan.nodes], [float(n.survival) for n in plan.nodes], [n.cand for n in plan.nodes]


def plan_nodes(lm: LM, result: RoundResult) -> tuple[PlanNode, ...]:
    """Every verified draft node with its score, the target's probability, its verdict and whether
    it lies on prompt lookup's chain."""
    tokens, parents, outcome = result.tokens, result.parents, result.outcome
    checks, accepted, depth = {c.node: c for c in outcome.checks}, set(outcome.accepted), depths(parents)
    scores, survival, cands = plan_scores(result.plan)
    entropies = row_entropies(result.logits) if result.logits is not None else [None] * len(tokens)
    on_chain = lookup_nodes(cands, [p - 1 for p in parents[1:]], result.draft.extra)
    out = []
    for i in range(1, len(tokens)):
        chk = checks.get(i)
        verdict = "accepted" if i in accepted else ("rejected" if chk else "not_reached")
        out.append(PlanNode(i, parents[i], depth[i], cands[i - 1], tokens[i], lm.piece(tokens[i]),
                            float(scores[i - 1]), survival[i - 1], float(result.p_rows[parents[i], tokens[i]]),
                            chk.p_accept if chk else None, chk.draw if chk else None, verdict,
                            lookup=on_chain[i - 1], target_entropy=entropies[parents[i]],
                            sources=cell_sources(result.draft, depth[i], cands[i - 1])))
    return tuple(out)


def cell_sources(draft: LatticeDraft, depth: int, cand: int) -> tuple[str, ...]:
    """Who proposed the lattice cell a plan node came from (() when the lattice is not labelled)."""
    if depth > len(draft.sources) or cand >= len(draft.sources[depth - 1]):
        return ()
    return draft.sources[depth - 1][cand]


def size_info(cost: CostTable | None, choice) -> SizeChoiceInfo | None:
    if choice is None:
        return None
    return SizeChoiceInfo(cost.source, tuple(cost.verify_ms), choice.size, choice.expected_accepted,
                          choice.tokens_per_s, cost.overhead_ms)


# ------------------------------------------------------------------------------ stats
def dspark_stats(events: Sequence) -> dict:
    """vLLM's definitions (decoding.core.trace_totals.dspark_metrics) over the drafting rounds."""
    return dspark_metrics([e for e in events if isinstance(e, DSparkRound)])
