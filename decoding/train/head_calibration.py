"""Calibrate the feature drafter as DSpark's sequential head (decoding.drafters.feature_lattice).

ŝ_k(x | parent) should be the chance that x is accepted at position k given that the path to its parent
was: at temperature 0 the chance that x is the target's greedy token, at temperature T > 0 the target's
probability of x at T (the tree rule accepts a candidate with exactly that chance). On held-out prompts of
the training mix (the feature drafter's own held-out split) the target's greedy answers give the path:
from every anchor the head steps along the true tokens with its own predicted features, and each of its
top-K candidates at position k is a hit when it equals the target's token there; at T its hit is the
target's probability of it at T (from the target's LM-head input stored with the answer). Per position a
Platt pair (a_k, b_k) on logit q is fitted on half the sequences; the expected calibration error (ECE,
decoding.core.formulas) before and after is measured on the other half; the shipped pair is then fitted
on all. The pairs for T > 0 are fitted at one temperature (`--temperature`, 0.8 by default) and used at
every T > 0.

Entry point: `python -m decoding train head-calibration [--model DIR] [--draft FILE] [--prompts N]
[--answer-tokens N] [--temperature T] [--out FILE]`. Writes the JSON file the head loads (next to the feature
drafter's weights by default, where DSpark's `--drafter feature:FILE` finds it). With `--model` (a target of
your own) the drafter is the one `train feature --model` wrote by default, unless `--draft` names it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.errors import ConfigError, check
from decoding.drafters.feature_lattice import CALIBRATION_FORMAT, HeadCalibration, logit
from decoding.runtime.files import check_writable, write_text_atomic
from decoding.runtime.paths import calibration_path
from decoding.train.common import ece


@dataclass(frozen=True)
class Samples:
    """Per scored candidate: its 0-based position, the head's probability q and whether it was a hit; at
    a sampling temperature T, the head's probability at T and the target's (its chance of acceptance)."""

    position: torch.Tensor     # (N,) long
    q: torch.Tensor            # (N,) float
    hit: torch.Tensor          # (N,) bool
    sequence: torch.Tensor     # (N,) long: which answer the anchor lies in
    q_sampled: torch.Tensor    # (N,) float: the head's q at T (empty without T)
    p_target: torch.Tensor     # (N,) float: the target's probability at T (empty without T)


@dataclass(frozen=True)
class Target:
    """The target's LM head (V, H, float32) and the sampling temperature the T > 0 pairs are fitted at."""

    head: torch.Tensor
    temperature: float


def target_probs_at(target: Target, hidden: torch.Tensor, tokens: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """(n, K) the target's probability at target.temperature of tokens[i, j] after the LM-head input hidden[i]
    (n, H), computed `rows` rows at a time (each a (rows, V) block of logits)."""
    out = []
    for i in range(0, len(hidden), rows):
        z = hidden[i:i + rows].float() @ target.head.T / target.temperature                          # (r, V)
        out.append(torch.exp(z.gather(1, tokens[i:i + rows]) - torch.logsumexp(z, -1, keepdim=True)))
    return torch.cat(out) if out else hidden.new_zeros((0, tokens.shape[1]), dtype=torch.float32)


@torch.inference_mode()
def head_samples(net, data, gamma: int, top_k: int, target: Target | None = None, chunk: int = 4096) -> Samples:
    """Step every anchor of `data` (decoding.train.data.DistillData) along its true answer for γ
    positions; record the top-K candidates' q and hits at each position inside the answer (and, with a
    `target`, the head's and the target's probabilities of them at its temperature). A head whose vocabulary
    slice is smaller than top_k scores all of it."""
    from decoding.train.data import anchors, sequence_ends

    rows = anchors(data)
    seq_of = torch.bucketize(rows, data.offsets[1:], right=True)
    out: list[list[torch.Tensor]] = [[], [], [], [], [], []]
    ids = net.vocab_ids.cpu()
    top_k = min(top_k, len(ids))
    for i in range(0, len(rows), chunk):
        r, seq = rows[i:i + chunk], seq_of[i:i + chunk]
        end = sequence_ends(data, r)
        feature, token = data.hidden[r].to(net.dtype), data.tokens[r]
        for k in range(gamma):
            target_row = r + k + 1
            inside = target_row < end
            feature = net.step(feature, token)
            logits = net.slice_logits(feature).float()
            q_top, cols = torch.topk(torch.softmax(logits, -1), top_k)                   # (n, K)
            at = torch.where(inside, target_row, r)                                       # (n,) rows read
            truth = data.tokens[at]
            hit = ids[cols] == truth[:, None]
            keep = inside[:, None].expand_as(hit)
            out[0].append(torch.full_like(q_top, k, dtype=torch.long)[keep]), out[1].append(q_top[keep])
            out[2].append(hit[keep]), out[3].append(seq[:, None].expand_as(hit)[keep])
            if target is not None:
                q_at = torch.softmax(logits / target.temperature, -1).gather(1, cols)
                out[4].append(q_at[keep]), out[5].append(target_probs_at(target, data.hidden[at], ids[cols])[keep])
            token = truth
    return Samples(*(torch.cat(x) if x else torch.zeros(0) for x in out))


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


def platt(q: torch.Tensor, ab: tuple[float, float]) -> torch.Tensor:
    """The head's calibrated scores under the pair (a, b)."""
    return HeadCalibration((ab[0],), (ab[1],))(0, q.double())


def calibrate(samples: Samples, gamma: int, temperature: float | None = None) -> dict:
    """Per position: the pair fitted on all samples, and the held-back half's ECE raw and calibrated
    (with the pair fitted on the other half); with a `temperature` (samples taken at it) the same for
    the pairs used at T > 0 under "sampled"."""
    report = {"format": CALIBRATION_FORMAT, **pairs(samples, samples.q, samples.hit, gamma)}
    if temperature is not None:
        report["sampled"] = {"temperature": temperature, **pairs(samples, samples.q_sampled, samples.p_target, gamma)}
    return report


def pairs(samples: Samples, q: torch.Tensor, hit: torch.Tensor, gamma: int) -> dict:
    """{"a", "b", "positions"}: per position the Platt pair of `hit` (bools, or acceptance chances) on q."""
    fit_half = samples.sequence % 2 == 0
    rows = []
    for k in range(gamma):
        at = samples.position == k
        half = platt_half(q[at], hit[at], fit_half[at])
        pair = fit_platt(q[at], hit[at])
        rows.append({"position": k + 1, "a": pair[0], "b": pair[1], "samples": int(at.sum()),
                     "hit_rate": float(hit[at].double().mean()), **half})
    return {"a": [r["a"] for r in rows], "b": [r["b"] for r in rows], "positions": rows}


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


MAX_FIT_TEMPERATURE = 4.0
CARD_START, CARD_END = "<!-- head-calibration -->", "<!-- /head-calibration -->"


def card_section(report: dict) -> str:
    """The model card's section on the head's calibration (Markdown, from the report only)."""
    d = report["data"]
    target = f"--model {d['model']} " if d.get("model", "default") != "default" else ""
    lines = [CARD_START, "## As DSpark's sequential head: calibration", "",
             f"`python -m decoding train head-calibration {target}--prompts {d['prompts']} --answer-tokens "
             f"{d['answer_tokens']}`: {d['split']}, answered greedily by the target ({d['positions']} positions); "
             f"from every anchor the head steps along the target's tokens and scores its top {d['top_k']} "
             "candidates per position. ŝ = σ(a · logit q + b) per position; ECE (10 bins) on the half of the "
             "answers the pair was not fitted on.", "",
             "| k | a | b | hit rate (top-" + str(d["top_k"]) + " candidates) | ECE raw | ECE calibrated |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['position']} | {r['a']:.3f} | {r['b']:.3f} | {r['hit_rate']:.3f} | {r['ece_raw']:.3f} | "
              f"{r['ece_calibrated']:.3f} |" for r in report["positions"]]
    sampled = report.get("sampled")
    if sampled:
        lines += ["", f"At temperature > 0 (pairs fitted at T = {sampled['temperature']:g}): ŝ = σ(a · logit q_T + b) "
                  "with q_T the head's probability at T, against the target's probability at T of each candidate "
                  "(its chance of acceptance under the tree rule); ECE as above.", "",
                  "| k | a | b | mean target probability | ECE raw | ECE calibrated |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['position']} | {r['a']:.3f} | {r['b']:.3f} | {r['hit_rate']:.3f} | {r['ece_raw']:.3f} | "
                  f"{r['ece_calibrated']:.3f} |" for r in sampled["positions"]]
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
    p.add_argument("--model", default="default", help="the target the drafter was trained for (as `train feature`)")
    p.add_argument("--model-dtype", default="auto", help="the target's dtype (as `train feature`)")
    p.add_argument("--prompts", type=int, default=96, help="held-out prompts answered by the target")
    p.add_argument("--answer-tokens", type=int, default=96)
    p.add_argument("--gamma", type=int, default=8, help="positions calibrated")
    p.add_argument("--top-k", type=int, default=4, help="candidates scored per position")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="sampling temperature the pairs used at T > 0 are fitted at (0: none fitted)")
    p.add_argument("--draft", default=None, help="feature drafter weights (default: the shipped one for the "
                                                 "embedded model, else the file `train feature --model` writes)")
    p.add_argument("--out", default=None, help="JSON file (default: next to the weights, which also updates the "
                                                "drafter's model card)")
    return p


def check_flags(args, weights: Path, out: Path) -> None:
    """Every flag in range, the drafter a feature-drafter weights file and --out writable; one line naming the
    flag otherwise."""
    from decoding.drafters.feature_net import DEFAULT_FEATURE, read_meta
    from decoding.runtime.weights_file import resolve_weights
    from decoding.train.common import is_drafter_file, is_model_card

    for name in ("prompts", "answer_tokens", "gamma", "top_k"):
        value = getattr(args, name)
        check(value >= 1, name, value, "must be an integer >= 1")
    check(args.gamma <= DSPARK_MAX_GAMMA, "gamma", args.gamma, f"must be at most {DSPARK_MAX_GAMMA}")
    check(math.isfinite(args.temperature) and 0 <= args.temperature <= MAX_FIT_TEMPERATURE, "temperature",
          args.temperature, f"must be a number in [0, {MAX_FIT_TEMPERATURE:g}] (0: no pairs for T > 0)")
    read_meta(resolve_weights(weights, DEFAULT_FEATURE, "feature-drafter", "python -m decoding train feature"))
    check_writable(out, "out")
    check(not out.is_file() or not (is_drafter_file(out) or is_model_card(out)), "out", str(out), "is a drafter's "
          "weights or model card; head-calibration writes a JSON report there: give another --out")


def main_head_calibration(argv: Sequence[str] | None = None) -> int:
    from decoding.drafters.feature_net import DEFAULT_FEATURE, load_feature
    from decoding.runtime.models import load
    from decoding.train.common import default_weights, target_spec
    from decoding.train.data import generate_distill

    args = build_parser().parse_args(argv)
    weights = Path(args.draft) if args.draft else default_weights(args.model, DEFAULT_FEATURE, "feature")
    out = Path(args.out) if args.out else calibration_path(weights)
    try:
        check_flags(args, weights, out)          # before the model loads and the answers are generated
        lm = load(target_spec(args))
        net = load_feature(lm, weights)          # a file trained for another model: one line, here
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    data = generate_distill(lm, heldout_prompts(lm, args.prompts), answer_tokens=args.answer_tokens, batch_size=16)
    head = lm.model.get_output_embeddings().weight.detach().float()
    target = Target(head, args.temperature) if args.temperature else None
    report = calibrate(head_samples(net, data, args.gamma, args.top_k, target), args.gamma,
                       args.temperature if target else None)
    report["data"] = {"model": args.model, "prompts": args.prompts, "answer_tokens": args.answer_tokens,
                      "positions": data.positions,
                      "top_k": args.top_k, "split": "the feature drafter's held-out prompts (one base prompt in 16)"}
    write_text_atomic(out, json.dumps(report, indent=1) + "\n")
    card = card_to_update(weights, out)
    if card is not None:
        write_text_atomic(card, with_card_section(card.read_text(encoding="utf-8"), card_section(report)))
    for label, part in (("T=0", report), (f"T={args.temperature:g}", report.get("sampled"))):
        for row in (part or {}).get("positions", ()):
            print(f"{label} k={row['position']}: a={row['a']:.3f} b={row['b']:.3f} hit rate {row['hit_rate']:.3f} "
                  f"ECE raw {row['ece_raw']:.3f} -> {row['ece_calibrated']:.3f} ({row['samples']} samples)")
    print(f"wrote {out}")
    return 0
