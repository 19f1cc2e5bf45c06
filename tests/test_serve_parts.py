"""The serve package's parts without a server: the request log's bounds, the streamed text's pieces,
vLLM's speculative counts, a request's settings checked by the command line's rules, the queue's limit,
and the serve command's own flags."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from cli_support import cli_main, one_line
from serve_support import rules, serve_args

from decoding.core.config import GreedyConfig, SampleConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.serve import settings
from decoding.serve.metrics import spec_counts
from decoding.serve.text import TextStream
from decoding.serve.trace_log import Bounds, TraceLog
from decoding.serve.worker import Busy, Job, Outbox, Timeline, Worker


def _add(log: TraceLog, n: int, size: int = 100) -> list[str]:
    return [log.add(f"req-{i}", {"pad": "x" * size}).name for i in range(n)]


def test_the_log_keeps_the_newest_within_its_count(tmp_path):
    names = _add(TraceLog(tmp_path, Bounds(max_count=3, max_bytes=10**9)), 5)
    assert [p.name for p in TraceLog(tmp_path, Bounds(3, 10**9)).files()] == names[2:]


def test_the_log_keeps_the_newest_within_its_bytes(tmp_path):
    log = TraceLog(tmp_path, Bounds(max_count=100, max_bytes=2500))
    names = _add(log, 6, size=1000)                       # ~1 kB each: two fit
    kept = log.files()
    assert [p.name for p in kept] == names[-2:] and sum(p.stat().st_size for p in kept) <= 2500


def test_a_record_larger_than_the_bytes_bound_is_not_kept(tmp_path):
    log = TraceLog(tmp_path, Bounds(max_count=100, max_bytes=500))
    _add(log, 1, size=100)
    _add(log, 1, size=1000)
    assert log.files() == []


def test_the_log_bounds_are_checked():
    with pytest.raises(ConfigError, match=r"^log_count=0 is invalid"):
        Bounds(0, 10)


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def test_streamed_pieces_wait_for_whole_characters_and_add_up_to_the_text():
    text = "é → ok"
    ids = list(text.encode())
    stream = TextStream(_bytes_decode, eos_ids={0})
    pieces = [stream.add([t]) for t in ids] + [stream.finish(text)]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert pieces[0] == "" and pieces[1] == "é"        # the first byte of é alone is held back


def test_a_final_eos_is_not_part_of_the_text():
    stream = TextStream(_bytes_decode, eos_ids={0})
    assert stream.add([104, 105, 0]) == "hi"


def test_spec_counts_are_vllms():
    """A draft is a round that proposed tokens; per position k, the rounds whose first k+1 drafts were accepted."""
    rounds = [SimpleNamespace(kind="spec_round", gamma=g, accepted=a) for g, a in [(3, 2), (3, 0), (0, 0), (2, 2)]]
    dspark = [SimpleNamespace(kind="dspark_round", prefill=True, nodes=(), accepted_path=()),
              SimpleNamespace(kind="dspark_round", prefill=False, nodes=(1, 2, 3, 4), accepted_path=(1,))]
    counts = spec_counts(rounds)
    assert (counts.drafts, counts.draft_tokens, counts.accepted, counts.accepted_per_pos) == (3, 8, 4, (2, 2, 0))
    assert spec_counts(dspark).accepted_per_pos == (1, 0, 0, 0) and spec_counts(dspark).drafts == 1
    assert spec_counts([SimpleNamespace(kind="token")]).drafts == 0


@pytest.fixture
def base():
    return serve_args("default", "--strategy", "speculative", "--gamma", "3", "--draft", "lookup")


def test_a_request_keeps_the_servers_settings_or_switches_strategy(base):
    same = settings.request_config(base, rules(), {"max_new_tokens": 5})
    assert same == SpeculativeConfig(gamma=3, draft="lookup", max_new_tokens=5)
    other = settings.request_config(base, rules(), {"strategy": "sample", "temperature": 0.7})
    assert other == SampleConfig(temperature=0.7, max_new_tokens=base.max_new_tokens)


def test_openai_temperature_zero_means_greedy_and_other_values_are_refused(base):
    greedy = serve_args("default")
    assert settings.request_config(greedy, rules(), settings.with_openai(greedy, {"temperature": 0.0}, {})) \
        == GreedyConfig(max_new_tokens=greedy.max_new_tokens)
    with pytest.raises(ConfigError, match=r"^temperature=0\.5 is invalid: does not apply to strategy 'greedy'"):
        settings.request_config(greedy, rules(), settings.with_openai(greedy, {"temperature": 0.5}, {}))


@pytest.mark.parametrize("overrides, line", [
    ({"gamma": 0}, r"^gamma=0 is invalid: must be an integer in \[1, 32\]"),          # the config's own range
    ({"gamma": 2.0}, r"^gamma=2\.0 is invalid: must be an integer"),
    ({"gamma_policy": "best"}, r"^gamma_policy='best' is invalid: choose one of fixed, heuristic"),
    ({"early_stopping": 1}, r"^early_stopping=1 is invalid: must be true or false"),
    ({"draft": "a/b"}, r"^draft='a/b' is invalid: must be a name"),
    ({"device": "cuda"}, r"^decodescope\.device='cuda' is invalid: is not a setting"),
])
def test_a_bad_override_is_refused_by_the_command_lines_rules(base, overrides, line):
    with pytest.raises(ConfigError, match=line):
        settings.request_config(base, rules(), overrides)


def _job(loop, name: str) -> Job:
    return Job(name, [1], GreedyConfig(), "", Outbox(loop), Timeline(0.0))


def test_the_queue_refuses_past_its_limit_and_serves_one_at_a_time():
    release, seen = threading.Event(), []
    worker = Worker(lambda job: (seen.append(job.request_id), release.wait(10)), lambda job, trace: None, 2)
    loop = asyncio.new_event_loop()
    first, second = _job(loop, "a"), _job(loop, "b")
    worker.submit(first)
    worker.submit(second)
    with pytest.raises(Busy, match=r"^queue: 2 requests are queued or decoding \(at most 2\)"):
        worker.submit(_job(loop, "c"))
    assert worker.running + worker.waiting == 2
    release.set()
    second.future.result(timeout=10)
    assert seen == ["a", "b"] and worker.running == worker.waiting == 0
    loop.close()


@pytest.mark.parametrize("flags, start", [(["--port", "70000"], "error: port=70000 is invalid"),
                                          (["--log-mb", "0"], "error: log_mb=0.0 is invalid"),
                                          (["--gamma", "3"], "error: gamma=3 is invalid: does not apply"),
                                          (["--strategy", "nope"], "error: argument --strategy: invalid choice")])
def test_serve_refuses_a_bad_flag_in_one_line_before_loading(capsys, flags, start):
    code, out, err = cli_main(["serve", *flags], capsys)
    assert code == 2 and one_line(err).startswith(start), err


def _fake_server(chat_template):
    from types import SimpleNamespace

    tok = SimpleNamespace(chat_template=chat_template)
    lm = SimpleNamespace(tokenizer=tok, encode=lambda text, chat_template: ("encoded", text, chat_template))
    args = SimpleNamespace(strategy="greedy", host="127.0.0.1", port=8000)
    return SimpleNamespace(lm=lm, args=args, served_name="m", log=SimpleNamespace(folder="F"))


def test_without_a_chat_template_the_messages_are_joined_and_the_server_says_so():
    from decoding.serve.cli import start_lines
    from decoding.serve.server import chat_ids

    plain = _fake_server(None)
    assert chat_ids(plain.lm, (("system", "Be brief."), ("user", "Hi"))) == ("encoded", "Be brief.\n\nHi", False)
    lines = start_lines(plain)
    assert len(lines) == 2 and lines[1] == "note: the model has no chat template: a chat's messages are joined by " \
                                           "blank lines"
    assert len(start_lines(_fake_server("{{ messages }}"))) == 1           # negative control: a template, no note


def test_serve_listens_on_loopback_unless_told_otherwise():
    assert serve_args("default").host == "127.0.0.1"
    assert serve_args("default", "--host", "0.0.0.0").host == "0.0.0.0"
