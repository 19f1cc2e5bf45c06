"""Calibrate the feature drafter as DSpark's sequential head (decoding.drafters.feature_lattice).

ŝ_k(x | parent) should be the chance that x is the target's greedy token at position k given that
the path to its parent was accepted. On held-out prompts of the training mix (the feature drafter's
own held-out split) the target's greedy answers give that path: from every anchor the head steps
along the true tokens with its own predicted features, and each of its top-K candidates at position k
is a hit when it equals the target's token there. Per position a Platt pair (a_k, b_k) on logit q is
fitted on half the sequences; the expected calibration error (ECE, decoding.core.formulas) before
and after is measured on the other half; the shipped pair is then fitted on all.

Entry point: `python -m decoding train head-calibration [--prompts N] [--answer-tokens N] [--out FILE]`.
Writes the JSON file the head loads (next to the feature drafter's weights by default).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.errors import ConfigError, check
from decoding.core.formulas import calibration_error
from decoding.drafters.feature_lattice import CALIBRATION_FORMAT, HeadCalibration, logit
from decoding.runtime.files import check_writable, write_text_atomic
from decoding.runtime.paths import calibration_path


@dataclass(frozen=True)
class Samples:
    """Per scored candidate: its 0-based position, the head's probability q and whether it was a hit."""

    position: torch.Tensor     # (N,) long
    q: torch.Tensor            # (N,) float
    hit: torch.Tensor          # (N,) bool
    sequence: torch.Tensor     # (N,) long: which answer the anchor lies in


@torch.inference_mode()
def head_samples(net, data, gamma: int, top_k: int, chunk: int = 4096) -> Samples:
    """Step every anchor of `data` (decoding.train.data.DistillData) along its true answer for γ
    positions; record the top-K candidates' q and hits at each position inside the answer."""
    from decoding.train.data import anchors, sequence_ends

    rows = anchors(data)
    seq_of = torch.bucketize(rows, data.offsets[1:], right=True)
    out: list[list[torch.Tensor]] = [[], [], [], []]
    ids = net.vocab_ids.cpu()
    for i in range(0, len(rows), chunk):
        r, seq = rows[i:i + chunk], seq_of[i:i + chunk]
        end = sequence_ends(data, r)
        feature, token = data.hidden[r].to(net.dtype), data.tokens[r]
        for k in range(gamma):
            target = r + k + 1
            inside = target < end
            feature = net.step(feature, token)
            q = torch.softmax(net.slice_logits(feature).float(), -1)
            q_top, cols = torch.topk(q, top_k)                                  # (n, K)
            truth = data.tokens[torch.where(inside, target, r)]
            hit = ids[cols] == truth[:, None]
            keep = inside[:, None].expand_as(hit)
            out[0].append(torch.full_like(q_top, k, dtype=torch.long)[keep]), out[1].append(q_top[keep])
            out[2].append(hit[keep]), out[3].append(seq[:, None].expand_as(hit)[keep])
            token = truth
    return Samples(*(torch.cat(x) for x in out))


def fit_platt(q: torch.Tensor, hit: torch.Tensor, steps: int = 200) -> tuple[float, float]:
    """(a, b) minimizing the log loss of σ(a · logit q + b) against the hits (LBFGS from the identity)."""
    x, y = logit(q.double()), hit.double()
    ab = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([ab], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ab[0] * x + ab[1], y)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(ab[0].detach()), float(ab[1].detach())


def ece(score: torch.Tensor, hit: torch.Tensor) -> float:
    """decoding.core.formulas.calibration_error over tensors (nan without samples)."""
    value = calibration_error(score.double().tolist(), hit.bool().tolist())
    return float("nan") if value is None else value


def platt(q: torch.Tensor, ab: tuple[float, float]) -> torch.Tensor:
    """The head's calibrated scores under the pair (a, b)."""
    return HeadCalibration((ab[0],), (ab[1],))(0, q.double())


def calibrate(samples: Samples, gamma: int) -> dict:
    """Per position: the pair fitted on all samples, and the held-back half's ECE raw and calibrated
    (with the pair fitted on the other half)."""
    fit_half = samples.sequence % 2 == 0
    rows = []
    for k in range(gamma):
        at = samples.position == k
        q, hit = samples.q[at], samples.hit[at]
        half = platt_half(q, hit, fit_half[at])
        pair = fit_platt(q, hit)
        rows.append({"position": k + 1, "a": pair[0], "b": pair[1], "samples": int(at.sum()),
                     "hit_rate": float(hit.double().mean()), **half})
    return {"format": CALIBRATION_FORMAT, "a": [r["a"] for r in rows], "b": [r["b"] for r in rows],
            "positions": rows}


def platt_half(q: torch.Tensor, hit: torch.Tensor, fit: torch.Tensor) -> dict:
    """ECE on the samples outside `fit`, raw and with the pair fitted on `fit`."""
    pair = fit_platt(q[fit], hit[fit])
    q_eval, hit_eval = q[~fit], hit[~fit]
    return {"ece_raw": ece(q_eval, hit_eval), "ece_calibrated": ece(platt(q_eval, pair), hit_eval)}


def heldout_prompts(lm, n: int, pool: int = 3072, every: int = 16, seed: int = 0) -> list[list[int]]:
    """The first n prompts of the feature drafter's held-out split (one base prompt in `every`)."""
    from decoding.train.data import distill_prompts, split_sequences

    texts = distill_prompts(pool, seed)
    _, held = split_sequences(pool, every)
    return [lm.encode(texts[i]) for i in held[:n]]


CARD_START, CARD_END = "<!-- head-calibration -->", "<!-- /head-calibration -->"


def card_section(report: dict) -> str:
    """The model card's section on the head's calibration (Markdown, from the report only)."""
    d = report["data"]
    lines = [CARD_START, "## As DSpark's sequential head: calibration", "",
             f"`python -m decoding train head-calibration --prompts {d['prompts']} --answer-tokens "
             f"{d['answer_tokens']}`: {d['split']}, answered greedily by the target ({d['positions']} positions); "
             f"from every anchor the head steps along the target's tokens and scores its top {d['top_k']} "
             "candidates per position. ŝ = σ(a · logit q + b) per position; ECE (10 bins) on the half of the "
             "answers the pair was not fitted on.", "",
             "| k | a | b | hit rate (top-" + str(d["top_k"]) + " candidates) | ECE raw | ECE calibrated |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['position']} | {r['a']:.3f} | {r['b']:.3f} | {r['hit_rate']:.3f} | {r['ece_raw']:.3f} | "
              f"{r['ece_calibrated']:.3f} |" for r in report["positions"]]
    return "\n".join(lines + [CARD_END])


def with_card_section(card: str, section: str) -> str:
    """The card with its calibration section replaced (appended when it has none)."""
    if CARD_START in card and CARD_END in card:
        head, rest = card.split(CARD_START, 1)
        return head + section + rest.split(CARD_END, 1)[1]
    return card.rstrip() + "\n\n" + section + "\n"


def card_to_update(weights: Path, out: Path) -> Path | None:
    """The drafter's model card (its weights' name, .md) when the calibration is written to its own place
    next to the weights and the card exists; None otherwise (a file written elsewhere leaves it alone)."""
    card = weights.with_suffix(".md")
    return card if out == calibration_path(weights) and card.is_file() else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m decoding train head-calibration", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=96, help="held-out prompts answered by the target")
    p.add_argument("--answer-tokens", type=int, default=96)
    p.add_argument("--gamma", type=int, default=8, help="positions calibrated")
    p.add_argument("--top-k", type=int, default=4, help="candidates scored per position")
    p.add_argument("--draft", default=None, help="feature drafter weights (default: the shipped one)")
    p.add_argument("--out", default=None, help="JSON file (default: next to the weights, which also updates the "
                                                "drafter's model card)")
    return p


def check_flags(args, out: Path) -> None:
    """Every flag in range and --out writable; one line naming the flag otherwise."""
    for name in ("prompts", "answer_tokens", "gamma", "top_k"):
        value = getattr(args, name)
        check(value >= 1, name, value, "must be an integer >= 1")
    check(args.gamma <= DSPARK_MAX_GAMMA, "gamma", args.gamma, f"must be at most {DSPARK_MAX_GAMMA}")
    check_writable(out, "out")


def main_head_calibration(argv: Sequence[str] | None = None) -> int:
    from decoding.drafters.feature_net import DEFAULT_FEATURE, load_feature
    from decoding.runtime.models import ModelSpec, load
    from decoding.train.data import generate_distill

    args = build_parser().parse_args(argv)
    weights = Path(args.draft) if args.draft else DEFAULT_FEATURE
    out = Path(args.out) if args.out else calibration_path(weights)
    try:
        check_flags(args, out)                   # before the model loads and the answers are generated
        lm = load(ModelSpec())
        net = load_feature(lm, args.draft)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    data = generate_distill(lm, heldout_prompts(lm, args.prompts), answer_tokens=args.answer_tokens, batch_size=16)
    report = calibrate(head_samples(net, data, args.gamma, args.top_k), args.gamma)
    report["data"] = {"prompts": args.prompts, "answer_tokens": args.answer_tokens, "positions": data.positions,
                      "top_k": args.top_k, "split": "the feature drafter's held-out prompts (one base prompt in 16)"}
    write_text_atomic(out, json.dumps(report, indent=1) + "\n")
    card = card_to_update(weights, out)
    if card is not None:
        write_text_atomic(card, with_card_section(card.read_text(encoding="utf-8"), card_section(report)))
    for row in report["positions"]:
        print(f"k={row['position']}: a={row['a']:.3f} b={row['b']:.3f} hit rate {row['hit_rate']:.3f} "
              f"ECE raw {row['ece_raw']:.3f} -> {row['ece_calibrated']:.3f} ({row['samples']} samples)")
    print(f"wrote {out}")
    return 0
