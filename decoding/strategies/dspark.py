"""Parallel drafting ("DSpark", Cheng et al. 2026), exact: per round one drafter pass over the target's
hidden states at the last emitted tokens gives a lattice of γ positions × K candidates; stage 1 (draft
side only) picks a chain (DP) or a tree (best-first), cost-aware when a verify-cost table is given;
stage 2 verifies it in ONE target forward (tree mask) and applies the exact acceptance rule; the KV
cache keeps the accepted path only. The hidden states for the next round come from that same forward.

Round r's tree: node 0 is the last emitted token (not yet in the cache), nodes 1.. the drafts."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from decoding.core.acceptance import RoundOutcome, greedy_round, sample_round
from decoding.core.config import DEFAULT_DRAFTER, DSparkConfig
from decoding.core.errors import check
from decoding.core.processors import build_pipeline
from decoding.core.token_step import sample_inverse_cdf
from decoding.core.trace import ChainDP, DSparkRound, LatticeCell, LatticeColumn, PlanNode, SizeChoiceInfo
from decoding.drafters.lattice_lookup import LookupInput, LookupRate, boost_chain, continuation, hits, lookup_nodes
from decoding.drafters.parallel import LatticeDraft, ParallelDrafter, build_lattice, load_drafter
from decoding.runtime.cost_table import CostTable, load_table
from decoding.runtime.hooks import tap_head_input
from decoding.runtime.models import LM, Timer
from decoding.runtime.paths import ASSETS
from decoding.strategies.dspark_select import ChainPlan, best_chain, best_tree, choose_chain, choose_tree, flat_tree
from decoding.strategies.tree_verify import compact_cache, depths, verify_tree

DEFAULT_WEIGHTS = ASSETS / "dspark-smollm2-135m.safetensors"


# ------------------------------------------------------------------------------ set-up
def resolve_drafter(lm: LM, config: DSparkConfig, drafter: ParallelDrafter | None) -> ParallelDrafter:
    """The drafter passed in (attached to lm if needed), or the weights file config.drafter names."""
    if drafter is None:
        path = DEFAULT_WEIGHTS if config.drafter == DEFAULT_DRAFTER else Path(config.drafter).expanduser()
        drafter = load_drafter(path, lm)
    elif drafter.head is None:
        drafter.attach(lm)
    check(drafter.shape.vocab_size == lm.vocab_size, "drafter", f"<vocab {drafter.shape.vocab_size}>",
          f"was trained for another model (this one has vocab {lm.vocab_size})")
    check(config.gamma <= drafter.shape.gamma_max, "gamma", config.gamma,
          f"must be <= the drafter's gamma_max ({drafter.shape.gamma_max})")
    return drafter


def load_cost(lm: LM, config: DSparkConfig) -> CostTable | None:
    """None (fixed size), the table in config.cost_table, or for "auto" the table profiled on this
    device on first use and cached (profiled again when it covers too few tokens)."""
    if config.cost_table is None:
        return None
    return load_table(lm, config.cost_table, config.cost_need())


def target_probs(logits: torch.Tensor, pipeline) -> torch.Tensor:
    """Processed target distribution per row (q, V); plain softmax at temperature 0 (for display)."""
    return torch.softmax(logits if pipeline is None else pipeline(logits), -1)


def truncate(emitted: Sequence[int], room: int, eos_ids) -> tuple[int, ...]:
    """At most `room` tokens, cut after the first EOS."""
    out = []
    for token in list(emitted)[:room]:
        out.append(int(token))
        if token in eos_ids:
            break
    return tuple(out)


# ------------------------------------------------------------------------------ stage 1
def select_plan(lattice, config: DSparkConfig, cost: CostTable | None):
    """(plan, size choice or None): chain DP or best-first tree, cost-aware with a table."""
    if config.select == "chain":
        if cost is None:
            return best_chain(lattice), None
        return choose_chain(lattice, cost)
    if cost is None:
        return best_tree(lattice, config.budget), None
    return choose_tree(lattice, cost, max_budget=config.budget)


# ------------------------------------------------------------------------------ trace pieces
def lattice_columns(lm: LM, draft: LatticeDraft) -> tuple[LatticeColumn, ...]:
    lat, cols = draft.lattice, []
    for k in range(lat.gamma):
        extra = draft.extra[k] if k < len(draft.extra) else None
        cells = tuple(LatticeCell(k + 1, j, tok, lm.piece(tok), float(lat.q_draft[k][j]),
                                  tuple(float(row[j]) for row in lat.scores[k]), lookup=j == extra)
                      for j, tok in enumerate(lat.token_ids[k]))
        cols.append(LatticeColumn(k + 1, draft.confidence[k], cells))
    return tuple(cols)


def chain_dp(plan) -> ChainDP | None:
    if not isinstance(plan, ChainPlan):
        return None
    values = tuple(tuple(tuple(float(v) for v in row) for row in pos) for pos in plan.values)
    return ChainDP(values, plan.back, plan.path)


def plan_nodes(lm: LM, plan, tokens, parents, p_rows: torch.Tensor, outcome: RoundOutcome,
               extra: Sequence[int] = ()) -> tuple[PlanNode, ...]:
    """Every verified draft node with its score, the target's probability, its verdict and whether
    it lies on prompt lookup's chain (`extra`: the lookup candidate's index per position)."""
    checks = {c.node: c for c in outcome.checks}
    accepted = set(outcome.accepted)
    depth = depths(parents)
    if isinstance(plan, ChainPlan):
        survival, scores, running = [], plan.scores, 1.0
        for s in scores:
            running *= float(s)
            survival.append(running)
        cands = plan.path
    else:
        scores = [n.score for n in plan.nodes]
        survival = [float(n.survival) for n in plan.nodes]
        cands = [n.cand for n in plan.nodes]
    on_chain = lookup_nodes(cands, [p - 1 for p in parents[1:]], extra)
    out = []
    for i in range(1, len(tokens)):
        chk = checks.get(i)
        verdict = "accepted" if i in accepted else ("rejected" if chk else "not_reached")
        out.append(PlanNode(i, parents[i], depth[i], cands[i - 1], tokens[i], lm.piece(tokens[i]),
                            float(scores[i - 1]), survival[i - 1], float(p_rows[parents[i], tokens[i]]),
                            chk.p_accept if chk else None, chk.draw if chk else None, verdict,
                            lookup=on_chain[i - 1]))
    return tuple(out)


def size_info(cost: CostTable | None, choice) -> SizeChoiceInfo | None:
    if choice is None:
        return None
    return SizeChoiceInfo(cost.source, tuple(cost.verify_ms), choice.size, choice.expected_accepted,
                          choice.tokens_per_s)


# ------------------------------------------------------------------------------ prefill and rounds
def prefill(lm: LM, cache, prompt_ids, forced, config: DSparkConfig, pipeline, generator, feature_layers=()):
    """Forward over prompt + forced tokens; choose the first free token. -> (event, hidden (F,)): the
    drafter's input row (the LM-head input, then `feature_layers`' outputs) at the last position."""
    timer = Timer(lm)
    with tap_head_input(lm, feature_layers) as tap:
        row = lm.forward(list(prompt_ids) + list(forced), cache, logits_to_keep=1)[-1]  # (V,)
    hidden = tap.hidden[0, -1]                                          # (F,) the head reads the last position only
    timer.lap("prefill")
    if pipeline is None:
        token, draw = int(torch.argmax(row)), None
    else:
        token, draw = sample_inverse_cdf(torch.softmax(pipeline(row), -1), generator)
    timer.lap("acceptance")
    emitted = truncate(list(forced) + [token], config.max_new_tokens, lm.eos_ids)
    event = DSparkRound(index=0, position=len(prompt_ids), prefill=True, select=config.select, lattice=(),
                        dp=None, nodes=(), expected_accepted=0.0, size=None, accepted_path=(),
                        next_token=token, next_from="prefill", next_draw=draw, emitted=emitted,
                        lossy=config.is_lossy, forced_ids=tuple(int(t) for t in forced),
                        fed_tokens=len(prompt_ids) + len(forced), timings_ms=timer.done(),
                        next_piece=lm.piece(token))
    return event, hidden


def draft_lattice(drafter, hidden, history: Sequence[int], gamma: int, config: DSparkConfig,
                  lookup: LookupInput | None) -> LatticeDraft:
    """The drafter's lattice, with prompt lookup's chain added and scored when there is one."""
    extra = lookup.tokens if lookup else ()
    draft = build_lattice(drafter, hidden, history, gamma, config.top_k_candidates, config.temperature, extra)
    if not draft.extra:
        return draft
    return dataclasses.replace(draft, lattice=boost_chain(draft.lattice, draft.extra, *lookup.scores))


def draft_round(lm: LM, cache, drafter, hidden, history: Sequence[int], gamma: int, config: DSparkConfig,
                cost, pipeline, generator, index: int, position: int, room: int,
                lookup: LookupInput | None = None):
    """One round with up to `gamma` draft positions (0: a plain step). `history`: the last emitted
    tokens (the root last), `hidden` (len(history), F) the drafter's input row (LM-head input first)
    at the position that produced each. -> (event, the rows (m, F) that produced the round's m
    emitted tokens)."""
    timer = Timer(lm)
    draft = plan = choice = None
    root = int(history[-1])
    if gamma >= 1:
        draft = draft_lattice(drafter, hidden, history, gamma, config, lookup)
        timer.lap("drafter")
        plan, choice = select_plan(draft.lattice, config, cost)
        tokens, parents = flat_tree(root, plan)
    else:
        tokens, parents = (root,), (-1,)
    timer.lap("dp")
    past = cache.get_seq_length()
    with tap_head_input(lm, drafter.shape.feature_layers) as tap:
        logits = verify_tree(lm, cache, tokens, parents)              # (q, V)
    rows_hidden = tap.hidden[0]                                         # (q, F)
    timer.lap("verification")
    p_rows = target_probs(logits, pipeline)                             # (q, V)
    if pipeline is None:
        outcome = greedy_round(tokens, parents, logits)
    else:
        outcome = sample_round(tokens, parents, p_rows, generator, config.lossy_threshold)
    timer.lap("acceptance")
    compact_cache(cache, past, [0] + list(outcome.accepted))
    timer.lap("cache")
    event = DSparkRound(
        index=index, position=position, prefill=False, select=config.select,
        lattice=lattice_columns(lm, draft) if draft else (), dp=chain_dp(plan),
        nodes=plan_nodes(lm, plan, tokens, parents, p_rows, outcome, draft.extra) if plan else (),
        expected_accepted=float(plan.expected_accepted) if plan else 0.0, size=size_info(cost, choice),
        accepted_path=outcome.accepted, next_token=outcome.next_token, next_from=outcome.next_from,
        next_draw=outcome.next_draw, emitted=truncate(outcome.emitted, room, lm.eos_ids),
        lossy=config.is_lossy, fed_tokens=len(tokens), timings_ms=timer.done(),
        next_piece=lm.piece(outcome.next_token), lookup=lookup.match if lookup else None,
        lookup_scores=lookup.scores if lookup else None)
    return event, rows_hidden[[0] + list(outcome.accepted)]


def round_lookup(config: DSparkConfig, context: Sequence[int], gamma: int, rate: LookupRate,
                 eos_ids) -> LookupInput | None:
    """This round's prompt-lookup input (None when lookup is off or there are no drafts)."""
    if config.lookup_max_ngram < 1 or gamma < 1:
        return None
    tokens, match = continuation(context, config.lookup_max_ngram, gamma, eos_ids)
    return LookupInput(tokens, match, rate.scores())


def decode(lm: LM, prompt_ids: Sequence[int], config: DSparkConfig, *, generator: torch.Generator,
           forced: Sequence[int] = (), drafter: ParallelDrafter | None = None) -> Iterator[DSparkRound]:
    """Yield the prefill event, then one DSparkRound per target forward until EOS, max_new_tokens or
    the context end."""
    drafter = resolve_drafter(lm, config, drafter)
    cost = load_cost(lm, config)
    pipeline = None if config.is_greedy else build_pipeline(config.temperature, config.top_k,
                                                            config.top_p, config.min_p)
    cache = lm.new_cache()
    event, hidden = prefill(lm, cache, prompt_ids, forced, config, pipeline, generator, drafter.shape.feature_layers)
    yield event
    hidden = hidden[None]                                           # (T, F): what produced each history token
    context, index, rate = list(prompt_ids) + list(event.emitted), 1, LookupRate()
    while len(context) - len(prompt_ids) < config.max_new_tokens and event.emitted[-1] not in lm.eos_ids:
        position = len(context)
        if position >= lm.context_length:
            return
        room = config.max_new_tokens - (position - len(prompt_ids))
        gamma = max(0, min(config.gamma, room - 1, lm.context_length - position - 1))
        lookup = round_lookup(config, context, gamma, rate, lm.eos_ids)
        event, produced = draft_round(lm, cache, drafter, hidden, context[len(context) - len(hidden):], gamma,
                                      config, cost, pipeline, generator, index, position, room, lookup)
        yield event
        context.extend(event.emitted)
        hidden = torch.cat([hidden, produced[:len(event.emitted)]])[-drafter.span:]
        rate = rate.updated(hits(lookup.tokens, event.emitted)) if lookup else rate
        index += 1


# ------------------------------------------------------------------------------ stats
def dspark_stats(events: Sequence) -> dict:
    """vLLM's definitions over the drafting rounds (prefill excluded): tokens emitted per verification
    forward, accepted / drafted nodes, per depth k the fraction of rounds (that drafted depth k)
    whose accepted path reached k."""
    rounds = [e for e in events if isinstance(e, DSparkRound) and not e.prefill]
    if not rounds:
        return {}
    drafted = sum(len(r.nodes) for r in rounds)
    accepted = sum(len(r.accepted_path) for r in rounds)
    reach = [max((n.depth for n in r.nodes), default=0) for r in rounds]
    per_position = tuple(sum(1 for r, d in zip(rounds, reach) if d > k and len(r.accepted_path) > k)
                         / sum(1 for d in reach if d > k) for k in range(max(reach)))
    return {"mean_accepted_length": sum(len(r.emitted) for r in rounds) / len(rounds),
            "acceptance_rate": accepted / drafted if drafted else None,
            "per_position_acceptance": per_position}
