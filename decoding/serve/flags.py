"""The serve command's own flags (the model and strategy flags are the command line's, decoding/__main__.py)."""
from __future__ import annotations

import argparse

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_LOG_COUNT = 500                 # request traces kept on disk
DEFAULT_LOG_MB = 200.0                  # and at most this many megabytes of them
DEFAULT_MAX_WAITING = 64                # requests queued or decoding before a new one is refused (429)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=LOOPBACK, help="address to listen on (default: this machine only; "
                                                    "0.0.0.0 listens on every interface)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", help="the model's id in /v1/models and in requests (default: the "
                                               "model's name, a local folder by its last part)")
    p.add_argument("--log-count", type=int, default=DEFAULT_LOG_COUNT,
                   help="request traces kept under the cache folder (oldest dropped)")
    p.add_argument("--log-mb", type=float, default=DEFAULT_LOG_MB,
                   help="megabytes of request traces kept (oldest dropped)")
    p.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                   help="requests queued or decoding at once; more are refused with 429")
