"""OpenAI's response shapes: a whole reply, the chunks of a streamed one (server-sent events), and an
error body carrying the one-line message."""
from __future__ import annotations

import json
import time

from decoding.serve.body import CHAT

FINISH = {"eos": "stop", "max_new_tokens": "length", "context": "length", "stopped": "abort", "error": "error"}


def finish_reason(stop_reason: str) -> str:
    return FINISH.get(stop_reason, "stop")


def error_body(line: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": line, "type": kind, "param": param, "code": None}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _head(kind: str, request_id: str, model: str, created: int, chunk: bool) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if kind == CHAT else "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model}


def whole(kind: str, request_id: str, model: str, text: str, finish: str, counts: tuple[int, int],
          extra: dict) -> dict:
    """The unstreamed reply; `extra` goes under "decodescope" (strategy, timing)."""
    if kind == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                  "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {**_head(kind, request_id, model, int(time.time()), False), "choices": [choice],
            "usage": usage(*counts), "decodescope": extra}


def chunk(kind: str, request_id: str, model: str, created: int, text: str | None, finish: str | None = None,
          first: bool = False) -> dict:
    """One streamed chunk: `text` (None in the last chunk, which carries `finish`)."""
    if kind == CHAT:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    return {**_head(kind, request_id, model, created, True), "choices": [choice]}


def usage_chunk(kind: str, request_id: str, model: str, created: int, counts: tuple[int, int], extra: dict) -> dict:
    """The chunk after the last when stream_options.include_usage is true: no choices, the usage."""
    return {**_head(kind, request_id, model, created, True), "choices": [], "usage": usage(*counts),
            "decodescope": extra}


def sse(data: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line ("[DONE]" as is)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
