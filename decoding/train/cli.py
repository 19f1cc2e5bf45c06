"""python -m decoding train {parallel,draft,feature,eval-feature,head-calibration,answers} [flags]: one row per
trainer (its name, what it does, the module that builds its flags and runs it); the module is imported only when
its command runs."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    module: str          # under decoding.train: parses the command's flags and runs it
    entry: str           # its function of argv -> exit status


COMMANDS = (
    Command("parallel", "the DSpark parallel drafter", "parallel", "main_train_parallel"),
    Command("draft", "the shallow self-draft for speculative decoding", "shallow", "main_train_draft"),
    Command("feature", "the feature drafter for speculative decoding", "feature", "main_train_feature"),
    Command("eval-feature", "held-out acceptance of feature-drafter files on one set", "feature_eval",
            "main_eval_feature"),
    Command("head-calibration", "the feature drafter's confidences as DSpark's head", "head_calibration",
            "main_head_calibration"),
    Command("answers", "generate the distillation answers and copy their files to ship", "answers_cli",
            "main_answers"),
)


def usage() -> str:
    names = ",".join(c.name for c in COMMANDS)
    rows = "\n".join(f"  {c.name:<18}{c.help}" for c in COMMANDS)
    return f"usage: python -m decoding train {{{names}}} [flags]  (--help for the flags)\n{rows}"


def main_cli(argv: Sequence[str]) -> int:
    """Run the trainer `argv[0]` names with the rest of `argv`; the usage and status 2 for any other name."""
    command = next((c for c in COMMANDS if argv and c.name == argv[0]), None)
    if command is None:
        print(usage(), file=sys.stderr)
        return 2
    return getattr(importlib.import_module(f"decoding.train.{command.module}"), command.entry)(argv[1:])


if __name__ == "__main__":
    sys.exit(main_cli(sys.argv[1:]))
