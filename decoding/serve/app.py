"""The routes (Starlette): /v1/completions and /v1/chat/completions (whole or streamed as server-sent
events), /v1/models, /health and /metrics; read-only, the request log (/v1/decodescope/requests). Every
refusal is OpenAI's error body with one line."""
from __future__ import annotations

import asyncio
import time

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from decoding.core.errors import ConfigError
from decoding.serve import body, replies, trace_log
from decoding.serve.body import CHAT, COMPLETION, TooLarge
from decoding.serve.server import NotServed, Server, has_chat_template
from decoding.serve.text import TextStream
from decoding.serve.worker import Busy, Job, Outbox

STATUS = ((TooLarge, 413), (NotServed, 404), (ConfigError, 400))


def refusal(status: int, line: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(replies.error_body(line, param, kind), status_code=status)


async def read_body(request: Request) -> bytes:
    """The body, refused once it passes body.MAX_BODY_BYTES (by its header or as it arrives)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > body.MAX_BODY_BYTES:
        raise body.too_large(int(declared))
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > body.MAX_BODY_BYTES:
            raise body.too_large(size)
        parts.append(part)
    return b"".join(parts)


async def completions(request: Request) -> Response:
    return await _answer(request, COMPLETION)


async def chat_completions(request: Request) -> Response:
    return await _answer(request, CHAT)


async def _answer(request: Request, kind: str) -> Response:
    server: Server = request.app.state.server
    arrived = time.perf_counter()
    try:
        asked = body.parse(body.parse_json(await read_body(request)), kind)
        job = await run_in_threadpool(server.job, asked, Outbox(asyncio.get_running_loop()), arrived)
        server.worker.submit(job)
    except ConfigError as err:
        return refusal(next(code for cls, code in STATUS if isinstance(err, cls)), str(err), err.param)
    except Busy as err:
        return refusal(429, str(err), kind="rate_limit_error")
    first = await _next(request, server, job)
    if first is None:                         # the client left while its request waited
        return Response(status_code=499)
    if first[0] in ("refused", "failed"):
        return refusal(400 if first[0] == "refused" else 500, first[1])
    if asked.stream:
        return StreamingResponse(_events(server, job, asked, first), media_type="text/event-stream")
    return await _whole(request, server, job, asked, first)


async def _next(request: Request, server: Server, job: Job, poll_s: float = 0.25) -> tuple | None:
    """The job's next item; None once the client has disconnected (its job is then stopped or dropped)."""
    waiting = asyncio.ensure_future(job.outbox.queue.get())
    while not (await asyncio.wait({waiting}, timeout=poll_s))[0]:
        if await request.is_disconnected():
            waiting.cancel()
            server.worker.cancel(job)
            return None
    return waiting.result()


async def _whole(request: Request, server: Server, job: Job, asked: body.Asked, item: tuple | None) -> Response:
    while item is not None and item[0] == "tokens":
        item = await _next(request, server, job)
    if item is None:
        return Response(status_code=499)
    if item[0] != "done":
        return refusal(500, item[1], kind="server_error")
    trace = item[1]
    if trace.error:
        return refusal(500, trace.error, kind="server_error")
    counts = (len(job.ids), len(trace.output_ids))
    return JSONResponse(replies.whole(asked.kind, job.request_id, server.served_name, server.answer_text(trace),
                                      replies.finish_reason(trace.stop_reason), counts, server.extra(job)))


async def _events(server: Server, job: Job, asked: body.Asked, item: tuple):
    """The streamed reply: a chunk per new piece of text, the last chunk with its finish reason, the usage
    when asked for, then [DONE]. A client that leaves stops its request (or drops it from the queue)."""
    head = (asked.kind, job.request_id, server.served_name, int(time.time()))
    text, ended = TextStream(server.lm.decode, server.lm.eos_ids), False
    try:
        if asked.kind == CHAT:
            yield replies.sse(replies.chunk(*head, "", first=True))
        while item[0] == "tokens":
            piece = text.add(item[1])
            if piece:
                yield replies.sse(replies.chunk(*head, piece))
            item = await job.outbox.queue.get()
        ended = True
        for event in _last_events(server, job, asked, head, text, item):
            yield replies.sse(event)
    finally:
        if not ended:
            server.worker.cancel(job)


def _last_events(server: Server, job: Job, asked: body.Asked, head: tuple, text: TextStream, item: tuple) -> list:
    if item[0] != "done" or item[1].error:
        line = item[1] if item[0] != "done" else item[1].error
        return [replies.error_body(line, kind="server_error"), "[DONE]"]
    trace = item[1]
    rest = text.finish(server.answer_text(trace))
    events = [replies.chunk(*head, rest)] if rest else []
    events.append(replies.chunk(*head, None, replies.finish_reason(trace.stop_reason)))
    if asked.include_usage:
        events.append(replies.usage_chunk(*head, (len(job.ids), len(trace.output_ids)), server.extra(job)))
    return [*events, "[DONE]"]


async def models(request: Request) -> Response:
    server: Server = request.app.state.server
    card = {"id": server.served_name, "object": "model", "created": server.started, "owned_by": "decodescope"}
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    server: Server = request.app.state.server
    return JSONResponse({"status": "ok", "model": server.served_name, "strategy": server.args.strategy,
                         "waiting": server.worker.waiting, "running": server.worker.running,
                         "chat_template": has_chat_template(server.lm)})


async def metrics(request: Request) -> Response:
    return Response(request.app.state.server.metrics.text(), media_type=CONTENT_TYPE_LATEST)


async def request_log(request: Request) -> Response:
    """The newest records' timing, oldest first (the app's Requests page reads it); read-only."""
    server: Server = request.app.state.server
    listed = await run_in_threadpool(trace_log.summaries, server.log)
    return JSONResponse({"object": "list", "data": listed})


async def request_record(request: Request) -> Response:
    """One record whole, trace included, by its request id."""
    server: Server = request.app.state.server
    request_id = request.path_params["request_id"]
    record = await run_in_threadpool(trace_log.find, server.log, request_id)
    if record is None:
        return refusal(404, f"request_id={request_id[:80]!r} is not in the request log", "request_id")
    return JSONResponse(record)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return refusal(exc.status_code, f"{request.method} {request.url.path[:80]}: {exc.detail}")


async def _internal(request: Request, exc: Exception) -> Response:
    return refusal(500, f"internal error: {type(exc).__name__}", kind="server_error")


def build_app(server: Server) -> Starlette:
    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics),
              Route("/v1/decodescope/requests", request_log),
              Route("/v1/decodescope/requests/{request_id}", request_record)]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _internal})
    app.state.server = server
    return app
