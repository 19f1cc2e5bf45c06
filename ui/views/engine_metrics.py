"""Speculative-decoding telemetry exported by serving engines, read into the Requests page's acceptance view
(ui.views.requests.Acceptance, vLLM's meanings). Three shapes are read (docs/serve.md names versions and
fields): a vLLM /metrics dump in Prometheus' text format (parsed by prometheus_client's parser), SGLang's
per-request `meta_info` (spec_verify_ct, spec_accept_length) and llama.cpp server's per-request `timings`
(draft_n, draft_n_accepted). Anything else is one line naming the file and the field."""
from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from ui.views.requests import Acceptance, RequestLogError

MAX_BYTES = 5 * 1024 * 1024
VLLM = "vllm:spec_decode_num_"         # prometheus_client drops the _total suffix of a counter's family


def _count(value, name: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise RequestLogError(f"{name}: {field}={str(value)[:40]!r} is not a count >= 0")
    return int(value)


def _position(text: str, name: str) -> int:
    if not (text.isdigit() and int(text) < 256):
        raise RequestLogError(f"{name}: position={text[:20]!r} is not a draft position 0..255")
    return int(text)


def from_prometheus(text: str, name: str) -> Acceptance:
    """vLLM's spec-decode counters summed over every label set but `position`."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith(VLLM) or not sample.name.endswith("_total"):
                    continue
                key = sample.name[len(VLLM):-len("_total")]
                if key == "accepted_tokens_per_pos":
                    pos = _position(sample.labels.get("position", ""), name)
                    per_pos[pos] = per_pos.get(pos, 0) + sample.value
                else:
                    totals[key] = totals.get(key, 0) + sample.value
    except ValueError as err:
        raise RequestLogError(f"{name}: not Prometheus text ({str(err)[:80]})") from None
    for field in ("drafts", "draft_tokens", "accepted_tokens"):
        if field not in totals:
            raise RequestLogError(f"{name}: no {VLLM}{field}_total counter (is it a vLLM /metrics dump?)")
    positions = tuple(_count(per_pos.get(k, 0), name, f"accepted_tokens_per_pos[{k}]")
                      for k in range(max(per_pos, default=-1) + 1))
    return Acceptance(f"vLLM ({name})", _count(totals["drafts"], name, "num_drafts"),
                      _count(totals["draft_tokens"], name, "num_draft_tokens"),
                      _count(totals["accepted_tokens"], name, "num_accepted_tokens"), positions)


def _replies(data) -> list:
    return data if isinstance(data, list) else [data]


def from_json(data, name: str) -> Acceptance:
    """SGLang replies (meta_info) or llama.cpp replies (timings): one reply or a list of them."""
    replies = _replies(data)
    if not replies or not all(isinstance(r, dict) for r in replies):
        raise RequestLogError(f"{name}: expected a reply object or a list of them")
    if all("meta_info" in r for r in replies):
        return _sglang(replies, name)
    if all("timings" in r for r in replies):
        return _llama_cpp(replies, name)
    raise RequestLogError(f"{name}: no meta_info (SGLang) or timings (llama.cpp) field in every reply")


def _sglang(replies: list, name: str) -> Acceptance:
    """SGLang gives per request the verification rounds and the mean tokens per round (accepted + 1)."""
    drafts = accepted = 0
    for i, reply in enumerate(replies):
        meta = reply["meta_info"] if isinstance(reply["meta_info"], dict) else {}
        rounds = _count(meta.get("spec_verify_ct"), name, f"[{i}].meta_info.spec_verify_ct")
        length = meta.get("spec_accept_length")
        if isinstance(length, bool) or not isinstance(length, (int, float)) or not length >= 1:
            raise RequestLogError(f"{name}: [{i}].meta_info.spec_accept_length={str(length)[:40]!r} is not >= 1")
        drafts += rounds
        accepted += round((length - 1) * rounds)
    return Acceptance(f"SGLang ({name})", drafts, 0, accepted, ())


def _llama_cpp(replies: list, name: str) -> Acceptance:
    """llama.cpp gives per request the drafted and accepted tokens (no rounds, no positions)."""
    drafted = accepted = 0
    for i, reply in enumerate(replies):
        timings = reply["timings"] if isinstance(reply["timings"], dict) else {}
        drafted += _count(timings.get("draft_n"), name, f"[{i}].timings.draft_n")
        accepted += _count(timings.get("draft_n_accepted"), name, f"[{i}].timings.draft_n_accepted")
    return Acceptance(f"llama.cpp ({name})", 0, drafted, accepted, ())


def read(raw: bytes, name: str) -> Acceptance:
    """A file's bytes: JSON (SGLang, llama.cpp) or else Prometheus text (vLLM)."""
    if len(raw) > MAX_BYTES:
        raise RequestLogError(f"{name}: {len(raw):,} bytes is over the {MAX_BYTES:,} byte limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestLogError(f"{name}: not UTF-8 text") from None
    if text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise RequestLogError(f"{name}: not valid JSON") from None
        return from_json(data, name)
    return from_prometheus(text, name)
