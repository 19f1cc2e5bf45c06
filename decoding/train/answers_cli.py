"""python -m decoding train answers [flags]: generate (or reuse) the distillation set's parts and copy each
part's answers file (decoding.train.answer_store) to --out, assets/distill/ by default, to ship them."""
from __future__ import annotations

import shutil
import sys

from decoding.core.errors import ConfigError
from decoding.runtime.files import check_folder
from decoding.runtime.paths import cache_dir
from decoding.train import answer_store
from decoding.train.common import settings_parser, target_spec
from decoding.train.data import DataSettings, distill_set


def main_answers(argv) -> int:
    parser = settings_parser("python -m decoding train answers", __doc__, DataSettings)
    parser.set_defaults(out=str(answer_store.SHIPPED))
    args = parser.parse_args(argv)
    from decoding.runtime.models import load

    try:
        settings = DataSettings(**{k: v for k, v in vars(args).items() if k in DataSettings.__dataclass_fields__})
        out = check_folder(args.out, "out")            # before the answers are generated
        lm = load(target_spec(args))
        _, data, source = distill_set(lm, settings, progress=not args.no_progress)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    copied = []
    for key in data.info.get("keys") or [data.info["key"]]:
        name = answer_store.file_name(key)
        source_file = answer_store.find(key) or cache_dir("distill") / name
        if not source_file.is_file():          # generated, but the cache could not keep it
            print(f"error: out={args.out!r} is invalid: the answers file {name} was not kept (the cache cannot be "
                  "written); set DECODESCOPE_CACHE to a writable folder", file=sys.stderr)
            return 2
        if source_file.resolve() != (out / name).resolve():
            shutil.copyfile(source_file, out / name)
        copied.append(f"{name} ({(out / name).stat().st_size / 1e3:.0f} kB)")
    print(f"{data.positions} positions from {source}; answers in {out}: {', '.join(copied)}")
    return 0
