"""Speculative-decoding telemetry exported by serving engines, read into the Requests page's acceptance view
(ui.views.requests.Acceptance, vLLM's meanings). Four shapes are read (docs/serve.md names versions and
fields): a vLLM /metrics dump in Prometheus' text format (parsed by prometheus_client's parser), vLLM's
per-request `metrics.speculative_decoding` (0.29 and later, `--per-request-spec-decode-metrics summary` or
`detailed`), SGLang's per-request `meta_info` (spec_verify_ct, spec_accept_length) and llama.cpp server's
per-request `timings` (draft_n, draft_n_accepted). Anything else is one line naming the file and the field."""
from __future__ import annotations

import json
import math
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from ui.views.requests import Acceptance, RequestLogError

MAX_BYTES = 5 * 1024 * 1024
VLLM = "vllm:spec_decode_num_"         # prometheus_client drops the _total suffix of a counter's family
MAX_DRAFT = 256                         # draft positions read (vLLM's num_spec_tokens, its /metrics positions)
MAX_STEPS = 1_000_000                   # a detailed reply's per-step entries


def _count(value, name: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf \
            or value != int(value):
        raise RequestLogError(f"{name}: {field}={str(value)[:40]!r} is not a count >= 0")
    return int(value)


def _position(text: str, name: str) -> int:
    if not (text.isdigit() and int(text) < MAX_DRAFT):
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
    """vLLM replies (metrics), SGLang replies (meta_info) or llama.cpp replies (timings): one reply or a list."""
    replies = _replies(data)
    if not replies or not all(isinstance(r, dict) for r in replies):
        raise RequestLogError(f"{name}: expected a reply object or a list of them")
    if all("meta_info" in r for r in replies):
        return _sglang(replies, name)
    if all("timings" in r for r in replies):
        return _llama_cpp(replies, name)
    if all("metrics" in r for r in replies):
        return _vllm_replies(replies, name)
    raise RequestLogError(f"{name}: no metrics (vLLM), meta_info (SGLang) or timings (llama.cpp) field in every "
                          "reply")


# -- vLLM's per-request metrics.speculative_decoding (docs/serve.md names the version and the fields) ----------

def _counts(value, name: str, field: str, limit: int) -> list[int]:
    if not isinstance(value, list) or len(value) > limit:
        raise RequestLogError(f"{name}: {field}={str(value)[:40]!r} is not a list of at most {limit:,} counts")
    return [_count(v, name, f"{field}[{k}]") for k, v in enumerate(value)]


def _ratio(spec: dict, key: str, want: float | None, name: str, where: str) -> None:
    """A reported ratio checked against the counts it is made of; without a denominator (no steps, no drafts) the
    docs do not say its value, so only its type is checked."""
    value = spec.get(key)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is None:
        ok = value is None or number
    else:
        ok = number and abs(value - want) <= 1e-6 * max(1.0, abs(want))
    if not ok:
        what = "a number" if want is None else f"{want:.6g}, the ratio of the counts beside it"
        raise RequestLogError(f"{name}: {where}.{key}={repr(value)[:40]} is not {what}")


def _vllm_summary(spec: dict, name: str, where: str) -> tuple[list[int], int, int]:
    """(acceptance_histogram, num_draft_tokens, num_accepted_draft_tokens) of one request, each field checked
    against the others as vLLM defines them."""
    k = _count(spec.get("num_spec_tokens"), name, f"{where}.num_spec_tokens")
    hist = _counts(spec.get("acceptance_histogram"), name, f"{where}.acceptance_histogram", MAX_DRAFT + 1)
    if len(hist) != k + 1:
        raise RequestLogError(f"{name}: {where}.acceptance_histogram has {len(hist)} counts, not num_spec_tokens + 1 "
                              f"= {k + 1}")
    steps, accepted, drafted = (_count(spec.get(field), name, f"{where}.{field}")
                                for field in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"))
    _vllm_agree(hist, steps, accepted, drafted, name, where)
    _ratio(spec, "mean_acceptance_length", 1 + accepted / steps if steps else None, name, where)
    _ratio(spec, "draft_acceptance_rate", accepted / drafted if drafted else None, name, where)
    return hist, drafted, accepted


def _vllm_agree(hist: list[int], steps: int, accepted: int, drafted: int, name: str, where: str) -> None:
    """The counts say what the histogram says: its sum is the steps, its accepted drafts the accepted, and the
    drafts lie between those and k per step."""
    k, from_hist = len(hist) - 1, sum(j * n for j, n in enumerate(hist))
    if steps != sum(hist):
        raise RequestLogError(f"{name}: {where}.num_spec_steps={steps} is not the histogram's sum ({sum(hist)})")
    if accepted != from_hist:
        raise RequestLogError(f"{name}: {where}.num_accepted_draft_tokens={accepted} is not the histogram's "
                              f"accepted drafts ({from_hist})")
    if not accepted <= drafted <= k * steps:
        raise RequestLogError(f"{name}: {where}.num_draft_tokens={drafted} is not between the accepted drafts "
                              f"({accepted}) and num_spec_tokens × num_spec_steps ({k * steps})")


def _vllm_detailed(spec: dict, hist: list[int], name: str, where: str) -> None:
    """`detailed`'s per-step arrays: one entry per verification step, each step's accepted <= its drafted, and
    together the summary's histogram."""
    accepted = _counts(spec.get("per_step_accepted"), name, f"{where}.per_step_accepted", MAX_STEPS)
    drafted = _counts(spec.get("per_step_drafted"), name, f"{where}.per_step_drafted", MAX_STEPS)
    if not len(accepted) == len(drafted) == sum(hist):
        raise RequestLogError(f"{name}: {where}.per_step_accepted and per_step_drafted have {len(accepted)} and "
                              f"{len(drafted)} steps, not num_spec_steps = {sum(hist)}")
    bad = next((i for i, (a, d) in enumerate(zip(accepted, drafted)) if a > d), None)
    if bad is not None:
        raise RequestLogError(f"{name}: {where}.per_step_accepted[{bad}]={accepted[bad]} is more than "
                              f"per_step_drafted[{bad}]={drafted[bad]}")
    seen = Counter(accepted)
    if [seen[j] for j in range(len(hist))] != hist:
        raise RequestLogError(f"{name}: {where}.per_step_accepted does not add up to acceptance_histogram")


def _add(total: list[int], hist: list[int]) -> list[int]:
    size = max(len(total), len(hist))
    return [(total[j] if j < len(total) else 0) + (hist[j] if j < len(hist) else 0) for j in range(size)]


def _vllm_spec(reply: dict, name: str, where: str) -> dict:
    metrics = reply["metrics"]
    if not isinstance(metrics, dict) or "speculative_decoding" not in metrics:
        raise RequestLogError(f"{name}: {where} is missing (vLLM 0.29+ adds it with --per-request-spec-decode-metrics "
                              "summary or detailed)")
    spec = metrics["speculative_decoding"]
    if spec is None:
        raise RequestLogError(f"{name}: {where} is null (vLLM's value for n > 1 or without speculative decoding)")
    if not isinstance(spec, dict):
        raise RequestLogError(f"{name}: {where}={str(spec)[:40]!r} is not an object")
    return spec


def _vllm_replies(replies: list, name: str) -> Acceptance:
    """vLLM gives per request its verification steps, drafts and accepted drafts, and the histogram of steps by
    drafts accepted, from which per-position acceptance follows (rounds accepting at least k+1)."""
    total: list[int] = []
    drafted = accepted = detailed = 0
    for i, reply in enumerate(replies):
        where = f"[{i}].metrics.speculative_decoding"
        spec = _vllm_spec(reply, name, where)
        hist, d, a = _vllm_summary(spec, name, where)
        if "per_step_accepted" in spec or "per_step_drafted" in spec:
            _vllm_detailed(spec, hist, name, where)
            detailed += 1
        total, drafted, accepted = _add(total, hist), drafted + d, accepted + a
    per_pos = tuple(sum(total[k + 1:]) for k in range(len(total) - 1))
    level = f"{len(replies)} requests" + (f", {detailed} detailed" if detailed else "")
    return Acceptance(f"vLLM per request ({name}, {level})", sum(total), drafted, accepted, per_pos)


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
