"""python -m decoding train {parallel,draft,feature,eval-feature,head-calibration,answers} [flags]: dispatch to
one trainer (answers: generate the distillation set's answers and copy their compact files to ship; eval-feature:
held-out acceptance of feature-drafter files on one set)."""
from __future__ import annotations

import sys
from collections.abc import Sequence


def main_cli(argv: Sequence[str]) -> int:
    """`train parallel [flags]` (the dspark drafter), `train draft [flags]` (the shallow self-draft) or
    `train feature [flags]` (the feature drafter) or `train head-calibration [flags]` (its confidences
    as DSpark's sequential head)."""
    if argv and argv[0] == "parallel":
        from decoding.train.parallel import main_train_parallel

        return main_train_parallel(argv[1:])
    if argv and argv[0] == "draft":
        from decoding.train.shallow import main_train_draft

        return main_train_draft(argv[1:])
    if argv and argv[0] == "feature":
        from decoding.train.feature import main_train_feature

        return main_train_feature(argv[1:])
    if argv and argv[0] == "eval-feature":
        from decoding.train.feature_eval import main_eval_feature

        return main_eval_feature(argv[1:])
    if argv and argv[0] == "answers":
        from decoding.train.answers_cli import main_answers

        return main_answers(argv[1:])
    if argv and argv[0] == "head-calibration":
        from decoding.train.head_calibration import main_head_calibration

        return main_head_calibration(argv[1:])
    print("usage: python -m decoding train {parallel,draft,feature,eval-feature,head-calibration,answers} [flags]  "
          "(--help for the flags)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main_cli(sys.argv[1:]))
