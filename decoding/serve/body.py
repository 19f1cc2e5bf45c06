"""A request body read and checked: its size, its JSON, OpenAI's fields and DecodeScope's one extra field,
`decodescope` (the strategy and its settings, checked in settings.py). Anything wrong is a ConfigError:
one line naming the field and the value."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from decoding.core.errors import ConfigError, check

MAX_BODY_BYTES = 1 << 20                 # a request body larger than this is refused (413)
COMPLETION = "completion"
CHAT = "chat"
ROLES = ("system", "user", "assistant")
# OpenAI's fields read here, by the flag that holds them (max_completion_tokens: chat's newer name).
AS_FLAG = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "temperature": "temperature",
           "top_p": "top_p", "seed": "seed"}
# OpenAI's fields taken only at the value that changes nothing (what this endpoint does anyway).
NEUTRAL = {"n": (1,), "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False,),
           "echo": (False,), "stop": ([],), "logit_bias": ({},), "suffix": ("",), "best_of": (1,)}
COMMON = ("model", "stream", "stream_options", "user", "decodescope", *AS_FLAG, *NEUTRAL)
FIELDS = {COMPLETION: ("prompt", *COMMON), CHAT: ("messages", *COMMON)}


class TooLarge(ConfigError):
    """A body over MAX_BODY_BYTES (413)."""


@dataclass(frozen=True)
class Asked:
    """What a request asks for, its fields checked for type."""

    kind: str                                       # completion | chat
    model: str
    prompt: str | None = None                       # completion
    messages: tuple[tuple[str, str], ...] = ()      # chat: (role, text) in order
    stream: bool = False
    include_usage: bool = False
    openai: Mapping[str, object] = field(default_factory=dict)    # flag name -> value
    named: Mapping[str, str] = field(default_factory=dict)        # flag name -> the field that gave it
    own: Mapping[str, object] = field(default_factory=dict)       # the decodescope field


def too_large(size: int) -> TooLarge:
    return TooLarge("body", f"<{size} bytes>", f"is larger than {MAX_BODY_BYTES} bytes")


def _reject_constant(name: str):
    raise ConfigError("body", name, "is not JSON (NaN and Infinity are not numbers in JSON)")


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object."""
    if len(raw) > MAX_BODY_BYTES:
        raise too_large(len(raw))
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as err:
        raise ConfigError("body", f"<byte {err.start}>", "is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise ConfigError("body", f"<line {err.lineno}, column {err.colno}>", f"is not JSON ({err.msg})") from None
    except RecursionError:
        raise ConfigError("body", "<nested too deep>", "is not JSON this endpoint reads") from None
    check(isinstance(body, dict), "body", f"<{type(body).__name__}>", "must be a JSON object")
    return body


def parse(body: dict, kind: str) -> Asked:
    """The request `body` of an endpoint of `kind`, its fields checked for type."""
    unknown = sorted(set(body) - set(FIELDS[kind]))
    if unknown:
        raise ConfigError(unknown[0][:64], "<given>", f"is not a field of this endpoint; it reads "
                                                      f"{', '.join(FIELDS[kind][:2])}, {', '.join(AS_FLAG)}, "
                                                      "stream, stream_options and decodescope")
    _check_neutral(body)
    model = body.get("model")
    check(isinstance(model, str), "model", model, "must be the served model's id (GET /v1/models)")
    check(body.get("max_tokens") is None or body.get("max_completion_tokens") is None, "max_completion_tokens",
          body.get("max_completion_tokens"), "give max_tokens or max_completion_tokens, not both")
    openai = {AS_FLAG[k]: v for k, v in body.items() if k in AS_FLAG and v is not None}
    named = {AS_FLAG[k]: k for k in body if k in AS_FLAG and body[k] is not None}
    own = body.get("decodescope") or {}
    check(isinstance(own, dict), "decodescope", own, "must be an object of settings, e.g. {\"strategy\": \"greedy\"}")
    stream, usage = _stream(body)
    text = _prompt(body.get("prompt")) if kind == COMPLETION else None
    messages = _messages(body.get("messages")) if kind == CHAT else ()
    return Asked(kind, model, text, messages, stream, usage, openai, named, own)


def _check_neutral(body: dict) -> None:
    for name, allowed in NEUTRAL.items():
        value = body.get(name)
        ok = value is None or any(type(value) is type(a) and value == a for a in allowed)
        check(ok, name, value, f"is not supported here (only {allowed[0]!r})")


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream")
    check(stream is None or isinstance(stream, bool), "stream", stream, "must be true or false")
    options = body.get("stream_options")
    check(options is None or (isinstance(options, dict) and set(options) <= {"include_usage"}),
          "stream_options", options, "must be an object with include_usage only")
    usage = (options or {}).get("include_usage")
    check(usage is None or isinstance(usage, bool), "stream_options.include_usage", usage, "must be true or false")
    check(bool(stream) or options is None, "stream_options", options, "is for stream=true only")
    return bool(stream), bool(usage)


def _prompt(prompt) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    check(isinstance(prompt, str), "prompt", _short(prompt), "must be text (one string)")
    check(prompt.strip() != "", "prompt", prompt, "must not be empty")
    return prompt


def _messages(messages) -> tuple[tuple[str, str], ...]:
    check(isinstance(messages, list) and len(messages) > 0, "messages", _short(messages),
          "must be a non-empty list of {role, content}")
    return tuple(_message(m, i) for i, m in enumerate(messages))


def _message(message, i: int) -> tuple[str, str]:
    check(isinstance(message, dict), f"messages[{i}]", _short(message), "must be an object {role, content}")
    role, content = message.get("role"), message.get("content")
    check(role in ROLES, f"messages[{i}].role", _short(role), f"choose one of {', '.join(ROLES)}")
    if isinstance(content, list):            # content parts: text only
        check(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                  for p in content), f"messages[{i}].content", "<parts>", "takes text parts only")
        content = "".join(p["text"] for p in content)
    check(isinstance(content, str), f"messages[{i}].content", _short(content), "must be text")
    return role, content


def _short(value, limit: int = 60):
    """A value as an error shows it: long text and containers cut to `limit` characters."""
    shown = repr(value)
    return value if len(shown) <= limit else f"<{type(value).__name__}, {len(shown)} characters>"
