"""A draft model as a lattice source (`--drafter model:ID`): any causal LM with the target's vocabulary and
tokenizer drafts its own greedy path, γ tokens on its own KV cache, and each step's top-K tokens become that
depth's candidates under the path's token before them; a candidate's prior is the draft model's probability.
Nothing here reads the round's target forward, so the plan stays a draft-side choice.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.draft_names import DRAFT_MODEL
from decoding.core.lattice import ROOT, Proposal, SourceNode, SourceRequest
from decoding.core.processors import Pipeline
from decoding.drafters.base import DraftRequest
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.drafters.lattice_source import LatticeSource

TOP_K = 3                               # candidates per depth


class DraftModelSource(LatticeSource):
    name = DRAFT_MODEL

    def __init__(self, drafter: DraftModelDrafter, top_k: int = TOP_K):
        self.drafter, self.top_k = drafter, top_k

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.drafter.start(prompt_ids)

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        """The draft model's greedy path; at each depth its top-K under the path's previous token."""
        greedy = DraftRequest(request.gamma, Pipeline(()), True, torch.Generator())
        proposal = self.drafter.propose(context, greedy)
        nodes: list[SourceNode] = []
        parent = ROOT
        for k, token in enumerate(proposal.tokens):
            top = torch.topk(proposal.q_draft[k], self.top_k)                  # (K,) the path's token first
            cands = top.indices.tolist()
            if int(token) not in cands:                                         # a tie at the top: keep the path
                cands[-1] = int(token)
            first = len(nodes)
            for cand in cands:
                prob = float(proposal.q_draft[k, cand])
                if len(nodes) == request.max_nodes:
                    return Proposal(source=self.name, nodes=tuple(nodes))
                nodes.append(SourceNode(int(cand), parent, min(1.0, max(0.0, prob)), prob))
            parent = first + [n.token for n in nodes[first:]].index(int(token))
        return Proposal(source=self.name, nodes=tuple(nodes))
