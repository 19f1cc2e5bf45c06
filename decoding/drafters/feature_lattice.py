"""DSpark with a sequential head: the feature drafter's step (decoding.drafters.feature_net) fills the
lattice, so position k's candidates and scores are conditioned on the parent chosen at k−1.

The backbone is the target's own verification forward: it already yields, in one pass, the LM-head
input h_t that produced the round's root token. From (h_t, root) the net's step predicts the next
LM-head input, whose logits over the net's vocabulary slice give position 1's candidates. For each
position after that, the `expand` candidates of highest survival (the product of ŝ along their best
path) are stepped with their own token, and position k + 1's K candidates are the top-K of the
survival-weighted mixture of their distributions. A candidate reached from several parents keeps
the feature of its best one; a parent left unexpanded scores 0 for every child. Drafting stops
early once no path survives above `floor` (and prompt lookup's chain has ended).

Scores (the DP's ŝ): the calibrated chance that x is accepted given that its parent was, ŝ_k(x | y) =
σ(a_k · logit q_k(x | y) + b_k) (HeadCalibration; identity a = 1, b = 0 gives q itself): at temperature 0
the chance that x is the target's argmax, with q the head's probability; at temperature T > 0 the
target's probability of x at T (the chance the tree rule accepts x), with q the head's at T and a second
set of pairs fitted at one sampling temperature (the head is sharper than the target there). Everything
here is draft-side, so any lattice keeps decoding exact.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.draft_names import FEATURE_HEAD
from decoding.core.errors import ConfigError, check
from decoding.core.lattice import Lattice, LatticeDraft, LatticeRequest
from decoding.drafters.parallel import with_extra
from decoding.runtime.paths import calibration_path, shown_path

CALIBRATION_FORMAT = "decodescope-head-calibration/1"
DEFAULT_EXPAND = 2          # parents stepped per position (docs/drafters.md)
DEFAULT_FLOOR = 0.4         # stop drafting once every path's survival is below this (docs/drafters.md)


def logit(q: torch.Tensor) -> torch.Tensor:
    """log(q / (1 − q)), q clamped to [1e-6, 1 − 1e-6]."""
    q = q.clamp(1e-6, 1 - 1e-6)
    return torch.log(q / (1 - q))


@dataclass(frozen=True)
class HeadCalibration:
    """Per-position Platt scaling of the head's probability: ŝ_k = σ(a[k] · logit q + b[k]); positions
    past the last use the last pair. The identity (a = 1, b = 0) leaves q as it is. `sampled`: the pairs
    (a, b) used at temperature > 0 (fitted at one sampling temperature; the identity when absent)."""

    a: tuple[float, ...] = (1.0,)
    b: tuple[float, ...] = (0.0,)
    sampled: HeadCalibration | None = None

    def __post_init__(self):
        object.__setattr__(self, "a", tuple(float(v) for v in self.a))
        object.__setattr__(self, "b", tuple(float(v) for v in self.b))
        check(len(self.a) == len(self.b) >= 1 and all(v == v and abs(v) < 1e6 for v in self.a + self.b),
              "calibration", f"<{len(self.a)} a, {len(self.b)} b>", "must give finite a and b per position")

    def __call__(self, position: int, q: torch.Tensor) -> torch.Tensor:
        k = min(position, len(self.a) - 1)
        if self.a[k] == 1.0 and self.b[k] == 0.0:
            return q
        return torch.sigmoid(self.a[k] * logit(q) + self.b[k])

    def at(self, temperature: float) -> HeadCalibration:
        """The pairs that score the head at this temperature (0: greedy; above: `sampled`)."""
        if temperature == 0:
            return self
        return self.sampled if self.sampled is not None else HeadCalibration()

    @classmethod
    def load(cls, path: str | Path) -> HeadCalibration:
        """A JSON file {"format": CALIBRATION_FORMAT, "a": [...], "b": [...], ...}; errors name `calibration`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            check(False, "calibration", shown_path(path), f"could not be read ({type(err).__name__})")
        check(isinstance(data, dict) and data.get("format") == CALIBRATION_FORMAT, "calibration", shown_path(path),
              f"is not a {CALIBRATION_FORMAT} file")
        try:
            sampled = data.get("sampled")
            return cls(tuple(data["a"]), tuple(data["b"]),
                       cls(tuple(sampled["a"]), tuple(sampled["b"])) if sampled is not None else None)
        except (KeyError, TypeError, ValueError, AttributeError, ConfigError):
            check(False, "calibration", shown_path(path),
                  "must give lists a and b of finite numbers, one pair per position (and in `sampled` too)")


@dataclass(frozen=True)
class HeadShape:
    """What DSparkDecoder reads of a drafter's shape."""

    vocab_size: int
    feature_layers: tuple[int, ...] = ()
    gamma_max: int = DSPARK_MAX_GAMMA


class FeatureLatticeDrafter:
    """A DSpark drafter over a plain (non-attending) FeatureNet; it reads only the anchor's row."""

    span = 1
    kind = FEATURE_HEAD         # how the cells it proposes are labelled

    def __init__(self, net, calibration: HeadCalibration | None = None, expand: int = DEFAULT_EXPAND,
                 floor: float = DEFAULT_FLOOR):
        check(not net.attends, "drafter", "feature", "needs a feature drafter without attention")
        check(isinstance(expand, int) and expand >= 1, "expand", expand, "must be an integer >= 1")
        self.net, self.expand, self.floor = net, expand, float(floor)
        self.calibration = calibration or HeadCalibration()
        self.shape = HeadShape(net.vocab_size)
        self.name = getattr(net, "name", "feature")

    @torch.inference_mode()
    def lattice(self, hidden: torch.Tensor, history: Sequence[int], request: LatticeRequest) -> LatticeDraft:
        """At most γ positions of top-K candidates. The head stops once no deeper node can matter: every
        path's survival is below `floor`, or (a tree budget B) B nodes already drafted survive better than
        any deeper one can; prompt lookup's `extra` chain then goes on alone (one candidate per position,
        scored 0 here: its own rate scores it, decoding.drafters.lattice_lookup). hidden (T, F): the
        anchor row last."""
        gamma, extra = request.gamma, request.extra
        check(isinstance(gamma, int) and 1 <= gamma <= DSPARK_MAX_GAMMA, "gamma", gamma,
              f"must be an integer in [1, {DSPARK_MAX_GAMMA}]")
        check(len(extra) <= gamma, "extra", len(extra), f"must hold at most gamma ({gamma}) tokens")
        net = self.net
        device = net.head.device
        anchor = hidden.reshape(-1, hidden.shape[-1])[-1, :net.shape.hidden_size].to(device, net.dtype)
        walk = _Walk(self, request.temperature, min(request.top_k, len(net.vocab_ids)), device)
        features = net.step(anchor[None], torch.tensor([int(history[-1])], device=device))   # (1, H)
        stepped = torch.zeros(1, dtype=torch.long, device=device)   # candidate index (at k−1) of each feature row
        for pos in range(gamma):
            walk.position(pos, features, stepped, extra[pos] if pos < len(extra) else None)
            if pos + 1 == gamma or walk.settled(self.floor, request.budget):
                break
            features, stepped = walk.next_features(features)
        for token in extra[len(walk.tokens):]:
            walk.lookup_only(int(token))
        return walk.draft()


class _Walk:
    """One lattice being built, position by position (FeatureLatticeDrafter.lattice)."""

    def __init__(self, drafter: FeatureLatticeDrafter, temperature: float, top_k: int, device):
        self.drafter, self.net, self.temperature, self.top_k = drafter, drafter.net, temperature, top_k
        self.survival = torch.ones(1, device=device)    # (P,) per candidate at k−1 (the root at k = 0)
        self.best_parent = torch.zeros(1, dtype=torch.long, device=device)
        self.row_of: dict[int, int] = {}
        self.drafted: list[float] = []                  # best-path survival of every candidate so far
        self.tokens, self.q_rows, self.score_rows, self.conf_rows, self.extra_at = [], [], [], [], []
        self.own: list[int] = []                        # per position, the candidates the head proposed

    def position(self, pos: int, features: torch.Tensor, stepped: torch.Tensor, extra: int | None) -> None:
        """Candidates at 0-based `pos` from the stepped parents' distributions; the rest score 0."""
        self.row_of = {int(c): i for i, c in enumerate(stepped)}       # candidate at k−1 -> its feature row
        logits = self.net.slice_logits(features).float()                                    # (E, V_s)
        q_cond = torch.softmax(logits / self.temperature if self.temperature > 0 else logits, -1)
        weight = self.survival[stepped]                                                      # (E,)
        mix = (weight[:, None] * q_cond).sum(0) / weight.sum().clamp_min(1e-12)            # (V_s,)
        q_top, cols = torch.topk(mix, self.top_k)
        ids = self.net.vocab_ids[cols].tolist()
        self.own.append(len(ids))
        if extra is None:
            q_cols = q_cond[:, cols]                                                        # (E, K)
        else:
            ids, q_cols, q_top, at = with_extra(self.net, int(extra), ids, q_cond, mix, cols, q_top)
            self.extra_at.append(at)
        parents = len(self.survival)
        scores = q_cols.new_zeros(parents, len(ids))
        scores[stepped] = self.drafter.calibration.at(self.temperature)(pos, q_cols).clamp(0, 1)
        conf = q_cond.new_zeros(parents)
        conf[stepped] = q_cond.amax(-1)
        reach = self.survival[:, None] * scores                                             # (P, K')
        self.survival, self.best_parent = reach.max(0)
        self.tokens.append(ids), self.q_rows.append(q_top.clamp(0, 1).tolist())
        self.score_rows.append(scores.tolist()), self.conf_rows.append(tuple(conf.tolist()))

    def lookup_only(self, token: int) -> None:
        """A position past the head's last: prompt lookup's token alone, after the previous one."""
        parents = len(self.tokens[-1])
        self.tokens.append([token]), self.q_rows.append([0.0]), self.score_rows.append([[0.0]] * parents)
        self.conf_rows.append((0.0,) * parents), self.extra_at.append(0), self.own.append(0)

    def settled(self, floor: float, budget: int | None) -> bool:
        """No node past this position can enter the plan, or matter: the best survival here is below
        `floor`, or `budget` candidates drafted so far survive better (survival never grows along a path,
        and a tree's nodes include every candidate's best path)."""
        best = float(self.survival.max())
        self.drafted.extend(self.survival.tolist())
        return best < floor or (budget is not None and sum(s > best for s in self.drafted) >= budget)

    def next_features(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step the `expand` surviving candidates of highest survival from their best parent's feature."""
        alive = int((self.survival > 0).sum())
        keep = torch.topk(self.survival, max(1, min(self.drafter.expand, alive))).indices        # (E',)
        parent_rows = torch.tensor([self.row_of.get(int(p), 0) for p in self.best_parent[keep]], device=features.device)
        tokens = torch.tensor([self.tokens[-1][int(j)] for j in keep], device=features.device)
        return self.net.step(features[parent_rows], tokens), keep

    def draft(self) -> LatticeDraft:
        lattice = Lattice(self.tokens, self.q_rows, self.score_rows)
        return LatticeDraft(lattice, tuple(self.conf_rows), tuple(self.extra_at), tuple(self.own))


def load_feature_lattice(lm, path: str | Path | None = None) -> FeatureLatticeDrafter:
    """The shipped (or given) feature drafter as a DSpark sequential head, with its calibration file
    when there is one (else the identity)."""
    from decoding.drafters.feature_net import DEFAULT_FEATURE, load_feature

    net = load_feature(lm, path)
    calibration = calibration_path(Path(path) if path else DEFAULT_FEATURE)
    return FeatureLatticeDrafter(net, HeadCalibration.load(calibration) if calibration.is_file() else None)
