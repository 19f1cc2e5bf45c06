"""Start-up of `python -m decoding serve`: check the serve flags, load the model on the engine thread,
build the app and run it under uvicorn until Ctrl-C."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from decoding.core.errors import check
from decoding.runtime.engine_thread import ENGINE
from decoding.runtime.models import DEFAULT_MODEL, LM, ModelSpec, load
from decoding.serve.settings import Rules
from decoding.serve.trace_log import Bounds, TraceLog, default_folder

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
__all__ = ["Rules", "serve", "build_server", "served_name", "start_lines"]


def served_name(args: argparse.Namespace) -> str:
    """The model's id for clients: --served-model-name, else the model's name; a local folder or file by its
    last part (the server's folders are its own business)."""
    if args.served_model_name:
        return args.served_model_name
    if args.model == DEFAULT_MODEL:
        return EMBEDDED_NAME
    return Path(args.model).name if os.path.exists(args.model) else args.model


def check_flags(args: argparse.Namespace) -> Bounds:
    check(0 <= args.port <= 65535, "port", args.port, "must be in [0, 65535]")
    check(args.max_waiting >= 1, "max_waiting", args.max_waiting, "must be an integer >= 1")
    check(math.isfinite(args.log_mb) and args.log_mb > 0, "log_mb", args.log_mb, "must be a finite number > 0")
    return Bounds(args.log_count, max(1, int(args.log_mb * 1e6)))


def build_server(args: argparse.Namespace, rules: Rules, lm: LM, log_folder: Path | None = None):
    from decoding.serve.server import Server

    log = TraceLog(log_folder or default_folder(), check_flags(args))
    return Server(lm, args, rules, served_name(args), log)


def serve(args: argparse.Namespace, rules: Rules, spec: ModelSpec) -> int:
    import uvicorn

    from decoding.serve.app import build_app

    check_flags(args)
    ENGINE.enable()                       # loading and every request's steps run on the engine thread
    server = build_server(args, rules, load(spec))
    for line in start_lines(server):
        print(line, file=sys.stderr)
    uvicorn.run(build_app(server), host=args.host, port=args.port, log_level="warning")
    return 0


def start_lines(server) -> list[str]:
    """What the server says at start: what it serves and where; a line when the model has no chat template."""
    from decoding.serve.server import has_chat_template

    args = server.args
    lines = [f"serving {server.served_name} ({args.strategy}) at http://{args.host}:{args.port}/v1; "
             f"request traces in {server.log.folder}"]
    if not has_chat_template(server.lm):
        lines.append("note: the model has no chat template: a chat's messages are joined by blank lines")
    return lines
