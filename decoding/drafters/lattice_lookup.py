"""Prompt-lookup candidates in a parallel-drafting lattice (DSpark with `lookup_max_ngram` > 0).

Prompt lookup copies what followed an earlier occurrence of the context's last n-gram; the parallel
drafter guesses from the target's hidden state. Each is strong where the other is weak (copying a
given text vs. free writing), so the lookup continuation c_1..c_m joins the lattice as one more
candidate per position (decoding.drafters.parallel.build_lattice's `extra`). Its chain gets the score

    ŝ_k(c_k | c_{k−1}) = max(drafter's own score, λ_k),   λ_1 = first, λ_{k>1} = continuation,

where λ is the Laplace estimate (hits + 1) / (tries + 2) of how often the continuation's k-th token
equalled the token the round emitted there (given the ones before it did), counted over the run's
earlier rounds, apart for the first token and for the later ones. It is counted whether or not the
plan verified the lookup tokens, so a lookup the plan passed over is still measured (at temperature 0
an equal token is exactly one the argmax rule accepts). Everything here reads the context and
earlier rounds only, never the current round's target output, so the plan stays a draft-side choice
and decoding stays exact.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from decoding.core.lattice import Lattice, LatticeDraft, LookupInput
from decoding.core.trace import LookupMatch
from decoding.drafters.lookup import lookup_continuation


@dataclass(frozen=True)
class LookupRate:
    """Lookup tokens compared with what was emitted, and how many were equal: the first token of
    each continuation, and the later ones."""

    first_tries: int = 0
    first_hits: int = 0
    next_tries: int = 0
    next_hits: int = 0

    def scores(self) -> tuple[float, float]:
        """(λ_first, λ_continuation): Laplace estimates, 1/2 before any evidence."""
        return (float(Fraction(self.first_hits + 1, self.first_tries + 2)),
                float(Fraction(self.next_hits + 1, self.next_tries + 2)))

    def updated(self, tries: Sequence[tuple[int, bool]]) -> LookupRate:
        """After a round: (depth, equal) of each lookup token compared (see `hits`)."""
        first = [ok for depth, ok in tries if depth == 1]
        later = [ok for depth, ok in tries if depth > 1]
        return LookupRate(self.first_tries + len(first), self.first_hits + sum(first),
                          self.next_tries + len(later), self.next_hits + sum(later))


def hits(proposal: Sequence[int], emitted: Sequence[int]) -> list[tuple[int, bool]]:
    """(depth, equal) for the continuation's tokens against the tokens a round emitted, up to and
    including the first difference (a later token would have followed a rejected one)."""
    out = []
    for k, (token, got) in enumerate(zip(proposal, emitted), start=1):
        out.append((k, token == got))
        if token != got:
            break
    return out


def continuation(context: Sequence[int], max_ngram: int, max_tokens: int,
                 eos_ids=frozenset()) -> tuple[tuple[int, ...], LookupMatch | None]:
    """Prompt lookup's proposal (at most max_tokens, cut before an EOS; no match when nothing is left)
    from the most recent earlier occurrence of the longest n-gram with max_tokens tokens after it, else
    the leftmost (the text being copied is usually the nearest; on the benchmark and tour prompts this
    beat transformers' leftmost choice)."""
    if max_ngram < 1:
        return (), None
    tokens, match = lookup_continuation(context, max_ngram, max_tokens, eos_ids, latest=True)
    return tokens, (match if tokens else None)


def boost_chain(lattice: Lattice, at: Sequence[int], first: float, later: float) -> Lattice:
    """The lattice with the lookup chain's scores raised: at[k] is the lookup token's candidate index
    at position k+1; its score given the lookup parent (the root at k = 0) becomes max(score, λ)."""
    scores = [[list(row) for row in pos] for pos in lattice.scores]
    for k, j in enumerate(at):
        parent = 0 if k == 0 else at[k - 1]
        scores[k][parent][j] = max(scores[k][parent][j], first if k == 0 else later)
    return Lattice(lattice.token_ids, lattice.q_draft, scores)


def lookup_nodes(cands: Sequence[int], parents: Sequence[int], at: Sequence[int]) -> tuple[bool, ...]:
    """Per plan node (cands[i]: its candidate index, parents[i]: its parent node, −1 = root; parents
    before children; depth from the parents), whether it lies on the lookup chain."""
    out: list[bool] = []
    depth: list[int] = []
    for cand, parent in zip(cands, parents):
        d = 1 if parent < 0 else depth[parent] + 1
        depth.append(d)
        on_chain = d <= len(at) and cand == at[d - 1] and (parent < 0 or out[parent])
        out.append(on_chain)
    return tuple(out)


def lookup_lattice(lookup: LookupInput | None) -> LatticeDraft | None:
    """Prompt lookup's chain as the whole base lattice (no trained drafter): one candidate per position,
    scored λ_first, then λ_continuation; None when lookup proposed nothing."""
    if lookup is None or not lookup.tokens:
        return None
    first, later = lookup.scores
    m = len(lookup.tokens)
    lattice = Lattice([[int(t)] for t in lookup.tokens], [[0.0]] * m, [[[first]]] + [[[later]]] * (m - 1))
    return LatticeDraft(lattice, ((0.0,),) * m, (0,) * m, (0,) * m, ((("lookup",),),) * m)
