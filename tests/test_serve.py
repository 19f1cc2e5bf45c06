"""`python -m decoding serve` live on the tiny model (uvicorn in a thread, loopback), called with the official
openai SDK and with plain HTTP. The oracle: `python -m decoding run` greedy on the same prompt; the streamed
text equals the whole reply's, which equals the oracle's. Negative controls: the oracles of the prompts used
differ from one another, so a reply given to the wrong request, or the wrong prompt decoded, fails."""
from __future__ import annotations

import json
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
