"""Toy target/draft pairs and a deliberately wrong branch plan (the negative control of the tree-acceptance
tests)."""
from __future__ import annotations

import random
from fractions import Fraction

from decoding.core.acceptance import Branch
from decoding.lab.toy import random_table

F = Fraction


def toy_pair(seed: int, vocab: int = 3):
    rng = random.Random(seed)
    return random_table(rng, vocab), random_table(rng, vocab)


def retrospective_branches(p_target, children):
    """WRONG on purpose: the plan admits a candidate only if its acceptance draw succeeds; when it
    fails, the candidate was 'never admitted' and the target's own sample (not the residual) is used."""
    branches, reach = [], F(1)
    for j, token in enumerate(children):
        branches.append(Branch(reach * p_target[token], j))
        reach *= 1 - p_target[token]
    return branches + [Branch(reach, None, p_target)]
