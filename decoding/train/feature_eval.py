"""python -m decoding train eval-feature [data flags] --weights FILE [--weights FILE ...]: held-out acceptance of
feature-drafter files on one distillation set, by kind of part, so drafters trained on different sets are
compared on the same sequences. The kinds: the templated first part, the varied parts (second and third),
the follow-up conversations (the rest). Greedy drafting from every held-out anchor, own tokens and features,
as the trainer's model card measures it."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from decoding.core.errors import ConfigError
from decoding.train.common import settings_parser, target_spec
from decoding.train.data import DataSettings, DistillData, data_split, distill_set

KINDS = ("templated", "varied", "follow-up")


def held_by_kind(data: DistillData, every: int) -> dict[str, list[int]]:
    """{kind: held-out sequence ids} over the set's parts (kinds without a part are left out)."""
    _, held = data_split(data, every)
    bounds, start = [], 0
    for n in data.info.get("parts", [len(data.offsets) - 1]):
        bounds.append((start, start + n))
        start += n
    out: dict[str, list[int]] = {}
    for part, (a, b) in enumerate(bounds):
        kind = KINDS[0] if part == 0 else KINDS[1] if part < 3 else KINDS[2]
        out.setdefault(kind, []).extend(s for s in held if a <= s < b)
    return {k: v for k, v in out.items() if v}


def evaluate_files(lm, data: DistillData, every: int, paths: Sequence[str]) -> list[tuple[str, str, dict]]:
    """[(file, kind, metrics)] for every file and kind of part."""
    from decoding.drafters.feature_net import load_feature
    from decoding.train.feature import evaluate

    groups = held_by_kind(data, every)
    out = []
    for path in paths:
        net = load_feature(lm, path).float()
        out += [(path, kind, evaluate(net, data.subset(seqs))) for kind, seqs in groups.items()]
    return out


def render(rows: list[tuple[str, str, dict]]) -> str:
    lines = ["| weights | part kind | anchors | first draft top-1 | τ(γ=5) | τ(γ=8) |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {path} | {kind} | {m['positions']} | {m['top1']:.3f} | {m['tau_chain'][5]:.2f} | "
              f"{m['tau_chain'][8]:.2f} |" for path, kind, m in rows]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = settings_parser("python -m decoding train eval-feature", __doc__, DataSettings)
    parser.add_argument("--weights", action="append", required=True, help="a feature-drafter file (repeatable)")
    return parser


def main_eval_feature(argv: Sequence[str] | None = None) -> int:
    from decoding.drafters.feature_net import read_meta
    from decoding.runtime.models import load

    args = build_parser().parse_args(argv)
    try:
        settings = DataSettings(**{k: v for k, v in vars(args).items() if k in DataSettings.__dataclass_fields__})
        for path in args.weights:              # each a feature-drafter file, before the data is made
            read_meta(path)
        lm = load(target_spec(args))
        _, data, _ = distill_set(lm, settings, progress=not args.no_progress)
        print(render(evaluate_files(lm, data, settings.heldout_every, args.weights)))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
