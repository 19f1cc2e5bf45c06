"""`python -m decoding serve` live on the tiny model (uvicorn in a thread, loopback), called with the official
openai SDK and with plain HTTP. The oracle: `python -m decoding run` greedy on the same prompt; the streamed
text equals the whole reply's, which equals the oracle's. Negative controls: the oracles of the prompts used
differ from one another, so a reply given to the wrong request, or the wrong prompt decoded, fails."""
from __future__ import annotations

import json
import re
import threading

import pytest
from cli_support import cli_main
from serve_support import request, sse_payloads, start, streamed_text

PROMPTS = ("The cat sat on", "Numbers: one two", "A list of fruit", "Once upon a time", "Hello there, friend")
TOKENS = 12


@pytest.fixture(scope="module")
def live(tiny_dir, tmp_path_factory):
    server = start(tiny_dir, tmp_path_factory.mktemp("serve_log"), "--max-new-tokens", str(TOKENS))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live):
    from openai import OpenAI

    return OpenAI(base_url=live.base_url, api_key="unused", max_retries=0, timeout=60)


def cli_text(tiny_dir, capsys, prompt: str, *flags: str) -> str:
    """What `python -m decoding run` prints as the answer (greedy, the same model and token budget)."""
    code, out, err = cli_main(["run", "--model", str(tiny_dir), "--prompt", prompt, "--max-new-tokens", str(TOKENS),
                               *flags], capsys)
    assert code == 0, err
    return out.rsplit("\n[greedy] ", 1)[0]


@pytest.fixture(scope="module")
def greedy_oracle(live):
    """Each prompt's greedy answer from the engine directly (run(), as the command line runs it)."""
    from decoding.core.config import GreedyConfig
    from decoding.runner import run

    lm = live.server.lm
    return {p: run(lm, lm.encode(p, chat_template=False), GreedyConfig(max_new_tokens=TOKENS)).text for p in PROMPTS}


def test_the_oracles_differ(greedy_oracle):
    """The negative control of every comparison below: a reply crossed with another prompt's would not match."""
    assert len(set(greedy_oracle.values())) == len(PROMPTS)


@pytest.mark.slow                      # two model loads (the server's and the command line's): ~3 s
def test_completion_whole_and_streamed_equal_the_command_line(live, client, tiny_dir, capsys, greedy_oracle):
    prompt = PROMPTS[0]
    oracle = cli_text(tiny_dir, capsys, prompt, "--no-chat-template")
    whole = client.completions.create(model=live.server.served_name, prompt=prompt, max_tokens=TOKENS)
    parts = [c.choices[0].text for c in client.completions.create(model=live.server.served_name, prompt=prompt,
                                                                  max_tokens=TOKENS, stream=True)]
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == TOKENS
    assert len([p for p in parts if p]) > 1                 # streamed in pieces, not at the end
    assert whole.choices[0].text == "".join(parts) == oracle
    assert greedy_oracle[PROMPTS[1]] != oracle


@pytest.mark.slow
def test_chat_whole_and_streamed_equal_the_command_line_in_the_chat_template(live, client, tiny_dir, capsys,
                                                                            greedy_oracle):
    prompt = PROMPTS[2]
    oracle = cli_text(tiny_dir, capsys, prompt)               # run applies the chat template by default
    messages = [{"role": "user", "content": prompt}]
    whole = client.chat.completions.create(model=live.server.served_name, messages=messages, max_tokens=TOKENS)
    stream = client.chat.completions.create(model=live.server.served_name, messages=messages, max_tokens=TOKENS,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    parts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert whole.choices[0].message.content == "".join(parts) == oracle
    assert chunks[-1].usage.completion_tokens == TOKENS and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert greedy_oracle[prompt] != oracle                     # the template matters


def test_plain_http_whole_and_streamed(live, greedy_oracle):
    body = {"model": live.server.served_name, "prompt": PROMPTS[3], "max_tokens": TOKENS}
    status, text = request(live, "POST", "/v1/completions", body)
    assert status == 200 and json.loads(text)["choices"][0]["text"] == greedy_oracle[PROMPTS[3]]
    status, text = request(live, "POST", "/v1/completions", {**body, "stream": True})
    assert status == 200 and streamed_text(text) == greedy_oracle[PROMPTS[3]]
    assert json.loads(sse_payloads(text)[-2])["choices"][0]["finish_reason"] == "length"


def test_a_request_overrides_the_strategy_and_speculative_stays_lossless(live, client, greedy_oracle):
    prompt = PROMPTS[4]
    reply = client.completions.create(model=live.server.served_name, prompt=prompt, max_tokens=TOKENS,
                                      extra_body={"decodescope": {"strategy": "speculative", "draft": "lookup",
                                                                  "gamma": 3}})
    assert reply.model_extra["decodescope"]["strategy"] == "speculative"
    assert reply.choices[0].text == greedy_oracle[prompt]


def test_concurrent_requests_are_served_first_come_one_at_a_time(live, client, greedy_oracle):
    """Each reply matches its own prompt's greedy answer; decodes never overlap and start in arrival order."""
    replies, before = {}, len(live.server.log.files())

    def ask(prompt):
        replies[prompt] = client.completions.create(model=live.server.served_name, prompt=prompt, max_tokens=TOKENS)

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert {p: r.choices[0].text for p, r in replies.items()} == greedy_oracle
    timings = [r.model_extra["decodescope"]["timing"] for r in replies.values()]
    assert sum(t["queue_s"] > 0.01 for t in timings) >= 2        # they did wait for one another
    records = [json.loads(f.read_text()) for f in live.server.log.files()[before:]]
    spans = sorted((r["arrived_unix_s"] + r["timing"]["queue_s"], r["arrived_unix_s"] + r["timing"]["e2e_s"])
                   for r in records)
    assert len(spans) == len(PROMPTS)
    assert all(end <= start + 0.002 for (_, end), (start, _) in zip(spans, spans[1:]))


def _body(**fields) -> dict:
    return {"model": "MODEL", "prompt": "Hello", "max_tokens": 4, **fields}


HOSTILE = [   # (what, path, raw body or fields, status, the parameter the line names)
    ("huge", "/v1/completions", b'{"prompt": "' + b"a" * (2 << 20) + b'"}', 413, "body"),
    ("malformed JSON", "/v1/completions", b'{"model": ', 400, "body"),
    ("not an object", "/v1/completions", b"[1, 2]", 400, "body"),
    ("not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "body"),
    ("NaN", "/v1/completions", b'{"model": "MODEL", "prompt": "a", "top_p": NaN}', 400, "body"),
    ("nested too deep", "/v1/completions", b"[" * 100000 + b"]" * 100000, 400, "body"),
    ("max_tokens as text", "/v1/completions", _body(max_tokens="5"), 400, "max_tokens"),
    ("negative max_tokens", "/v1/completions", _body(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens past the context", "/v1/completions", _body(max_tokens=10**9), 400, "max_tokens"),
    ("infinite max_tokens", "/v1/completions", b'{"model": "MODEL", "prompt": "a", "max_tokens": 1e400}', 400,
     "max_tokens"),
    ("stream as text", "/v1/completions", _body(stream="yes"), 400, "stream"),
    ("prompt a number", "/v1/completions", _body(prompt=5), 400, "prompt"),
    ("prompt a lone surrogate", "/v1/completions", b'{"model": "MODEL", "prompt": "a\\udcff"}', 400, "prompt"),
    ("messages as text", "/v1/chat/completions", {"model": "MODEL", "messages": "hi"}, 400, "messages"),
    ("a made-up role", "/v1/chat/completions", {"model": "MODEL", "messages": [{"role": "root", "content": "x"}]},
     400, "messages[0].role"),
    ("an unknown field", "/v1/completions", _body(shell="rm -rf /"), 400, "shell"),
    ("n of two", "/v1/completions", _body(n=2), 400, "n"),
    ("decodescope not an object", "/v1/completions", _body(decodescope="greedy"), 400, "decodescope"),
    ("an unknown strategy", "/v1/completions", _body(decodescope={"strategy": "nope"}), 400, "strategy"),
    ("a strategy as a path", "/v1/completions", _body(decodescope={"strategy": "../greedy"}), 400, "strategy"),
    ("an unknown setting", "/v1/completions", _body(decodescope={"model": "/etc"}), 400, "decodescope.model"),
    ("gamma as text", "/v1/completions", _body(decodescope={"strategy": "speculative", "gamma": "4"}), 400, "gamma"),
    ("a draft path", "/v1/completions", _body(decodescope={"strategy": "speculative", "draft": "/etc/passwd"}),
     400, "draft"),
    ("a drafter file", "/v1/completions", _body(decodescope={"strategy": "dspark", "drafter": "feature:../x.bin"}),
     400, "drafter"),
    ("a cost table file", "/v1/completions",
     _body(decodescope={"strategy": "dspark", "cost_table": "../../costs.json"}), 400, "cost_table"),
    ("a setting of another strategy", "/v1/completions", _body(decodescope={"num_beams": 3}), 400, "num_beams"),
    ("temperature twice", "/v1/completions",
     _body(temperature=0.5, decodescope={"strategy": "sample", "temperature": 0.5}), 400, "decodescope.temperature"),
    ("another model", "/v1/completions", _body(model="gpt-4"), 404, "model"),
]
LOOKUPS = [   # (what, path, status, the parameter the line names): the read-only log routes' refusals (GET)
    ("an unknown request id", "/v1/decodescope/requests/cmpl-0000", 404, "request_id"),
]


def _server_folders(live) -> list[str]:
    import sysconfig
    from pathlib import Path

    from decoding.runtime.paths import ASSETS, cache_root

    return [str(live.server.log.folder), str(cache_root()), str(ASSETS), sysconfig.get_paths()["purelib"],
            str(Path(__file__).resolve().parents[1]), live.server.lm.name]


@pytest.mark.parametrize("what, path, payload, status, param", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_body_is_one_line_naming_the_field(live, what, path, payload, status, param):
    name = live.server.served_name
    raw = (payload.replace(b"MODEL", name.encode()) if isinstance(payload, bytes)
           else json.dumps({k: (name if v == "MODEL" else v) for k, v in payload.items()}).encode())
    code, text = request(live, "POST", path, raw)
    error = json.loads(text)["error"]
    assert code == status, text
    assert error["message"].startswith(f"{param}=") and "\n" not in error["message"], error
    assert "Traceback" not in text and not [f for f in _server_folders(live) if f in text]


@pytest.mark.parametrize("what, path, status, param", LOOKUPS, ids=[k[0] for k in LOOKUPS])
def test_a_lookup_the_log_cannot_answer_is_one_line_naming_the_field(live, what, path, status, param):
    code, text = request(live, "GET", path)
    message = json.loads(text)["error"]["message"]
    assert code == status and message.startswith(f"{param}=") and "\n" not in message, text


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/completions", 405), ("GET", "/etc/passwd", 404),
                                                  ("POST", "/v1/models", 405)])
def test_a_wrong_route_or_method_is_one_line(live, method, path, status):
    code, text = request(live, method, path)
    assert code == status and len(json.loads(text)["error"]["message"].splitlines()) == 1


def test_models_and_health(live):
    code, text = request(live, "GET", "/v1/models")
    assert code == 200 and [m["id"] for m in json.loads(text)["data"]] == [live.server.served_name]
    code, text = request(live, "GET", "/health")
    health = json.loads(text)
    assert code == 200 and health["status"] == "ok" and health["chat_template"] is True
    assert live.server.served_name == live.server.lm.name.rstrip("/").rsplit("/", 1)[-1]   # no folder of ours


def _samples(live) -> dict:
    """(sample name, sorted label items) -> value, from /metrics read by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    code, text = request(live, "GET", "/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, items), v in samples.items() if n == name and set(labels.items()) <= set(items))


def test_metrics_count_what_was_served(live, client):
    before, name = _samples(live), live.server.served_name
    client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=TOKENS)
    spec = {"strategy": "speculative", "draft": "lookup", "gamma": 4}
    client.completions.create(model=name, prompt="one two one two one two one", max_tokens=TOKENS,
                              extra_body={"decodescope": spec})
    after = _samples(live)
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    for hist in ("request_queue_time_seconds", "time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert _total(delta, f"vllm:{hist}_count") == 2
    assert _total(delta, "vllm:inter_token_latency_seconds_count", strategy="greedy") == TOKENS - 1
    assert _total(delta, "vllm:generation_tokens_total") == 2 * TOKENS
    assert _total(delta, "vllm:request_success_total", finished_reason="length") == 2
    steps = json.loads(live.server.log.files()[-1].read_text())["trace"]["steps"]
    rounds = [s for s in steps if s["kind"] == "spec_round" and s["gamma"] > 0]
    assert rounds and _total(delta, "vllm:spec_decode_num_drafts_total", strategy="speculative") == len(rounds)
    drafted, accepted = sum(r["gamma"] for r in rounds), sum(r["accepted"] for r in rounds)
    assert _total(delta, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert _total(delta, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert _total(delta, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert _total(delta, "vllm:spec_decode_num_drafts_total", strategy="greedy") == 0     # negative control


def test_each_request_leaves_its_trace_and_timing_in_the_log(live, client):
    reply = client.completions.create(model=live.server.served_name, prompt=PROMPTS[1], max_tokens=TOKENS)
    record = json.loads(live.server.log.files()[-1].read_text())
    assert record["id"] == reply.id and record["trace"]["text"].endswith(reply.choices[0].text)
    timing = record["timing"]
    assert len(timing["itl_s"]) == TOKENS - 1 and 0 <= timing["queue_s"] <= timing["ttft_s"] <= timing["e2e_s"]


def test_the_request_log_is_listed_and_read_back_by_id(live, client):
    reply = client.completions.create(model=live.server.served_name, prompt=PROMPTS[0], max_tokens=TOKENS,
                                      extra_body={"decodescope": {"strategy": "speculative", "draft": "lookup"}})
    status, text = request(live, "GET", "/v1/decodescope/requests")
    listed = json.loads(text)["data"]
    assert status == 200 and listed[-1]["id"] == reply.id and "trace" not in listed[-1]
    assert listed[-1]["rounds"] and all(0 <= a <= d for d, a in listed[-1]["rounds"])
    status, text = request(live, "GET", f"/v1/decodescope/requests/{reply.id}")
    assert status == 200 and json.loads(text)["trace"]["strategy"] == "speculative"
    for bad in ("cmpl-0000", "..%2F..%2Fetc%2Fpasswd", "cmpl-<script>"):      # unknown, a path, markup
        status, text = request(live, "GET", f"/v1/decodescope/requests/{bad}")
        assert status == 404 and len(text.splitlines()) == 1 and "root:" not in text, text


def test_a_client_that_leaves_mid_stream_stops_its_request(live):
    import http.client
    import time

    before = len(live.server.log.files())
    body = {"model": live.server.served_name, "prompt": PROMPTS[0], "max_tokens": 1000, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.read1(256).startswith(b"data: ")
    conn.close()
    deadline = time.monotonic() + 20
    while len(live.server.log.files()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    record = json.loads(live.server.log.files()[-1].read_text())
    assert record["finish_reason"] == "abort" and record["completion_tokens"] < 1000


def _refusals(live) -> dict[str, tuple[str, str]]:
    """Each hostile case's (status, message) as the server gives them, the served model's id as MODEL."""
    name, out = live.server.served_name, {}
    for what, path, payload, _, _ in HOSTILE:
        raw = (payload.replace(b"MODEL", name.encode()) if isinstance(payload, bytes)
               else json.dumps({k: (name if v == "MODEL" else v) for k, v in payload.items()}).encode())
        code, text = request(live, "POST", path, raw)
        out[what] = (str(code), json.loads(text)["error"]["message"].replace(name, "MODEL"))
    for what, path, _, _ in LOOKUPS:
        code, text = request(live, "GET", path)
        out[what] = (str(code), json.loads(text)["error"]["message"])
    return out


def errors_md_serve_rows() -> dict[str, tuple[str, str]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("\n## Serve\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|`]+?) \| (\d{3}) \| `(.+)` \|$", section, re.MULTILINE)
    return {what: (status, message) for what, status, message in rows}


def test_errors_md_quotes_every_serve_refusal(live):
    """docs/errors.md's Serve table holds exactly the status and message of every hostile case above.
    Negative control: a changed message would not match (the comparison is exact)."""
    given, quoted = _refusals(live), errors_md_serve_rows()
    assert quoted == given
    assert len(quoted) == len(HOSTILE) + len(LOOKUPS)


def test_the_benchmarks_clients_get_greedys_answers_under_every_strategy(live):
    """python -m bench serve's clients (bench/serve.py) against this server: two at once, greedy and speculative,
    no failure, and no answer that differs from greedy's (its negative control: tests/test_bench_serve.py)."""
    from openai import OpenAI

    from bench import serve as bench_serve

    client = OpenAI(base_url=live.base_url, api_key="unused", max_retries=0, timeout=60)
    names, results = ["gears", "tea", "sunset"], []
    for strategy in ("greedy", "speculative"):
        work = bench_serve.plan(3, 2, names, think_s=0.0, seed=0)
        results += bench_serve.level(client, live.server.served_name, strategy, 2, work, 6)
    assert len(results) == 6 and not [r.error for r in results if r.error]
    assert bench_serve.differing(results) == 0 and all(r.tokens == 6 and r.ttft_s is not None for r in results)


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(live):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=iter([b"x" * 600_000] * 3), encode_chunked=True,
                     headers={"content-type": "application/json"})
        reply = conn.getresponse()
        message = json.loads(reply.read())["error"]["message"]
    finally:
        conn.close()
    read = re.fullmatch(r"body='<(\d+) bytes>' is invalid: is larger than 1048576 bytes", message)
    assert reply.status == 413 and read and 1048576 < int(read.group(1)) <= 1800000, message   # cut off as it came


def test_a_request_whose_client_leaves_while_it_waits_is_dropped_from_the_queue(live):
    """A long streamed request holds the engine; a second client gives up while queued: the queue lets it go at
    once, without decoding it (the log gets no record of it)."""
    import http.client
    import socket
    import time

    def post(body, timeout):
        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        return conn

    base = {"model": live.server.served_name, "prompt": PROMPTS[1]}
    long_run = post({**base, "max_tokens": 1000, "stream": True}, 30)
    assert long_run.getresponse().read1(64).startswith(b"data: ")
    before = len(live.server.log.files())
    waiting = post({**base, "max_tokens": 4}, 0.5)
    with pytest.raises(socket.timeout):
        waiting.getresponse()
    assert live.server.worker.waiting == 1
    waiting.close()
    deadline = time.monotonic() + 5
    while live.server.worker.waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.server.worker.waiting == 0 and live.server.worker.running == 1     # the long one still decodes
    long_run.close()
    while live.server.worker.running and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    time.sleep(0.2)
    assert len(live.server.log.files()) == before + 1                            # the long one alone


def test_beam_search_answers_at_its_end_whole_and_streamed_as_the_engine_does(live):
    """Beam search knows its answer only when the search ends: the stream carries it then, equal to the whole
    reply and to run() with the same config. Negative control: greedy's answer to the prompt differs."""
    from decoding.core.config import BeamConfig, GreedyConfig
    from decoding.runner import run

    lm, prompt = live.server.lm, PROMPTS[3]
    oracle = run(lm, lm.encode(prompt, chat_template=False), BeamConfig(num_beams=2, max_new_tokens=6)).text
    body = {"model": live.server.served_name, "prompt": prompt, "max_tokens": 6,
            "decodescope": {"strategy": "beam", "num_beams": 2}}
    status, whole = request(live, "POST", "/v1/completions", body)
    status_s, streamed = request(live, "POST", "/v1/completions", {**body, "stream": True})
    assert status == status_s == 200
    assert json.loads(whole)["choices"][0]["text"] == streamed_text(streamed) == oracle
    assert run(lm, lm.encode(prompt, chat_template=False), GreedyConfig(max_new_tokens=6)).text != oracle


def test_seeded_sampling_through_openais_fields_repeats_the_engines_draw(live, client):
    """temperature, top_p and seed as OpenAI fields reach the sampler: the reply equals run() with the same
    SampleConfig. Negative control: another seed draws another answer."""
    from decoding.core.config import SampleConfig
    from decoding.runner import run

    lm, prompt = live.server.lm, PROMPTS[2]
    ids = lm.encode(prompt, chat_template=False)

    def engine(seed):
        return run(lm, ids, SampleConfig(temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=TOKENS)).text

    reply = client.completions.create(model=live.server.served_name, prompt=prompt, max_tokens=TOKENS,
                                      temperature=0.9, top_p=0.95, seed=7,
                                      extra_body={"decodescope": {"strategy": "sample"}})
    assert reply.choices[0].text == engine(7) and engine(8) != engine(7)
