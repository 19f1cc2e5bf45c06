"""A live `python -m decoding serve` in this process: the app under uvicorn in a thread on a free loopback
port, the tiny model (conftest's `tiny_dir`) loaded as the command line loads it; and plain HTTP to it."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from decoding import __main__ as cli


def serve_args(model: Path, *flags: str):
    return cli.build_parser().parse_args(["serve", "--model", str(model), *flags])


def rules():
    from decoding.serve.settings import Rules

    return Rules(flags=cli._flags("serve"), make_config=cli.make_config, check_applicable=cli.check_applicable,
                 strategy_kwargs=cli._strategy_kwargs)


@dataclass
class Live:
    server: object            # decoding.serve.server.Server
    port: int
    uvicorn: object
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=10)


def start(model: Path, log_folder: Path, *flags: str) -> Live:
    import uvicorn

    from decoding.runtime.models import load
    from decoding.serve.app import build_app
    from decoding.serve.cli import build_server

    args = serve_args(model, *flags)
    server = build_server(args, rules(), load(cli.model_spec(args)), log_folder)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    runner = uvicorn.Server(uvicorn.Config(build_app(server), log_level="warning"))
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not runner.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner.started, "the server did not start"
    return Live(server, sock.getsockname()[1], runner, thread)


def request(live: Live, method: str, path: str, body: bytes | dict | None = None,
         headers: dict | None = None) -> tuple[int, str]:
    """(status, body text) of one plain HTTP request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    try:
        conn.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        return reply.status, reply.read().decode("utf-8")
    finally:
        conn.close()


def sse_payloads(text: str) -> list[str]:
    """The data of each server-sent event, in order."""
    return [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]


def streamed_text(text: str, kind: str = "completion") -> str:
    """The concatenated text of a streamed reply's chunks (which must end with [DONE])."""
    payloads = sse_payloads(text)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    chunks = [json.loads(p) for p in payloads[:-1]]
    if kind == "chat":
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
