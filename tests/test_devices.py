"""Device handling. Models too large for one device, placed by accelerate (device_map="auto"): a tiny
llama saved to a directory and loaded with a memory budget that keeps part of it on the CPU and
offloads the rest to disk decodes token for token like the same model loaded plainly. Also: the
placement options' checks, the CLI flags, CUDA-event timing (with a stand-in for CUDA, on the CPU)
and the KV-cache keyword across transformers releases."""
from __future__ import annotations

import time

import pytest
import torch
from conftest import make_tiny_llama
from weights_support import half_the_weights, save_tiny

from decoding import runner
from decoding.core.config import BeamConfig, GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import without_timings
from decoding.runtime.model_spec import ModelSpec, parse_max_memory
from decoding.runtime.models import LM, Timer, load

PROMPT = "w1 w2 w3 w1 w2 w3 w1"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny_placed"))


@pytest.fixture(scope="module")
def plain(model_dir):
    """Loaded whole, on MKL's plain sgemm as the placed model is: the comparison is of placement alone
    (other GEMM kernels sum in another order, which moves numbers by float32 rounding on some CPUs)."""
    return load(ModelSpec(name=model_dir, device="cpu", pack_gemm=False))


@pytest.fixture(scope="module")
def placed(model_dir, tmp_path_factory):
    spec = ModelSpec(name=model_dir, device_map="auto", max_memory=half_the_weights(model_dir),
                     offload_folder=str(tmp_path_factory.mktemp("offload")))
    return load(spec)


def test_the_budget_splits_the_model_between_cpu_and_disk(placed):
    assert set(placed.placement) == {"cpu", "disk"}, placed.placement
    assert placed.describe()["device_map"] == placed.placement
    assert placed.device == torch.device("cpu")
    offloaded = [n for n, p in placed.model.named_parameters() if p.device.type == "meta"]
    assert offloaded and len(offloaded) < len(list(placed.model.parameters()))


@pytest.mark.parametrize("config", [GreedyConfig(max_new_tokens=12), BeamConfig(max_new_tokens=6, num_beams=2),
                                    SpeculativeConfig(draft="lookup", max_new_tokens=12, gamma=3)],
                         ids=["greedy", "beam", "speculative"])
def test_placed_model_decodes_like_the_plain_one(plain, placed, config):
    ids = plain.encode(PROMPT, chat_template=False)
    want = runner.run(plain, ids, config)
    got = runner.run(placed, ids, config)
    assert got.error is None and got.output_ids == want.output_ids          # token for token
    strip = lambda tr: {k: v for k, v in without_timings(tr).items() if k != "model"}  # noqa: E731
    assert strip(got) == strip(want)                                          # and every recorded number


def test_greedy_equals_transformers_generate_on_the_plain_model(plain, placed):
    ids = plain.encode(PROMPT, chat_template=False)
    x = torch.tensor([ids])
    ref = plain.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12,
                               min_new_tokens=12)[0, len(ids):].tolist()
    assert list(runner.run(placed, ids, GreedyConfig(max_new_tokens=12)).output_ids) == ref


def test_cli_device_map_flags(model_dir, tmp_path, capsys, plain):
    from decoding.__main__ import main

    out = tmp_path / "t.json"
    code = main(["run", "--model", model_dir, "--prompt", PROMPT, "--no-chat-template", "--max-new-tokens", "8",
                 "--device-map", "auto", "--max-memory", half_the_weights(model_dir),
                 "--offload-folder", str(tmp_path / "off"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    import json

    data = json.loads(out.read_text())
    assert set(data["model"]["device_map"]) == {"cpu", "disk"}
    ids = plain.encode(PROMPT, chat_template=False)
    assert data["output_ids"] == list(runner.run(plain, ids, GreedyConfig(max_new_tokens=8)).output_ids)


@pytest.mark.parametrize("kwargs, param", [
    ({"device_map": "everywhere"}, "device_map"),
    ({"max_memory": "cpu=1GiB"}, "max_memory"),                       # needs device_map
    ({"offload_folder": "/tmp/x"}, "offload_folder"),                 # needs device_map
    ({"device_map": "auto", "device": "cuda"}, "device"),
    ({"device_map": "auto", "max_memory": "cpu=lots"}, "max_memory"),
    ({"device_map": "auto", "max_memory": "gpu0=1GiB"}, "max_memory"),
    ({"device_map": "auto", "max_memory": "disk=1GiB"}, "max_memory"),
    ({"device_map": "auto", "max_memory": "0=1GiB,cuda:0=2GiB"}, "max_memory"),
])
def test_bad_placement_options_name_the_option(kwargs, param):
    with pytest.raises(ConfigError) as err:
        ModelSpec(name="x", **kwargs)
    assert err.value.param == param and "\n" not in str(err.value)


def test_max_memory_parses_to_accelerates_form():
    assert parse_max_memory("0=20GiB, cpu=64GB,cuda:1=1.5 kib,mps=300") == {0: 20 * 2**30, "cpu": 64 * 10**9,
                                                                            1: 1536, "mps": 300}
    assert parse_max_memory(None) == {} and parse_max_memory("") == {}
    assert ModelSpec(name="x", device_map="auto").placement_kwargs()["device_map"] == "auto"
    assert ModelSpec(name="x").placement_kwargs() == {}


# ------------------------------------------------------------------ CUDA-event timing, with a stand-in
class FakeEvent:
    """Stands in for torch.cuda.Event: records the host clock; counts synchronisations."""

    synchronized = 0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        FakeEvent.synchronized += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0


@pytest.fixture
def fake_cuda(monkeypatch):
    def no_sync(*_a, **_k):
        raise AssertionError("synchronised between phases")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    FakeEvent.synchronized = 0


def test_timer_uses_events_on_one_cuda_device_and_waits_once(fake_cuda):
    lm = LM(make_tiny_llama(), None, "tiny")
    lm.cuda_devices = [torch.device("cuda", 0)]
    start = time.perf_counter()
    timer = Timer(lm)
    time.sleep(0.02)
    timer.lap("forward")
    timer.lap("sampling")
    assert FakeEvent.synchronized == 0                        # nothing waited for so far
    phases = timer.done()
    wall = (time.perf_counter() - start) * 1000.0
    assert FakeEvent.synchronized == 1
    assert set(phases) == {"forward", "sampling", "other"}
    assert 20.0 <= phases["forward"] <= wall and sum(phases.values()) <= wall


def test_timer_on_several_cuda_devices_syncs_them_all(monkeypatch):
    lm = LM(make_tiny_llama(), None, "tiny")
    lm.cuda_devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "Event", None)            # control: events are not used here
    Timer(lm).done()
    assert synced == lm.cuda_devices * 2                      # at the start and at the one lap


def test_a_drafter_refuses_a_target_whose_head_is_offloaded(placed, model_dir, tmp_path):
    """The parallel drafter reads the target's LM head rows; with the head on disk it says so."""
    from decoding.drafters.parallel import DrafterShape, ParallelDrafter

    spec = ModelSpec(name=model_dir, device_map="auto", max_memory="cpu=1B", offload_folder=str(tmp_path))
    offloaded = load(spec)
    assert offloaded.model.get_output_embeddings().weight.device.type == "meta"
    drafter = ParallelDrafter(DrafterShape(32, 64, gamma_max=2, rank=2, trunk=8, width=4))
    with pytest.raises(ConfigError, match="offloaded") as err:
        drafter.attach(offloaded)
    assert err.value.param == "drafter"
    assert drafter.attach(placed).head is not None          # control: a head kept on the CPU is fine


def test_the_cache_keyword_follows_the_installed_transformers():
    from decoding.runtime.models import cache_keyword

    class OlderForward(torch.nn.Module):     # a forward from before the `cache` name
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None

    class NewerForward(torch.nn.Module):     # a forward that takes `cache` (transformers 5.24 does)
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return None

    assert cache_keyword(NewerForward()) == "cache"
    assert cache_keyword(OlderForward()) == "past_key_values"
    # the installed release's llama: whichever name its forward takes (5.24 'cache', 5.17 'past_key_values')
    import inspect

    named = inspect.signature(make_tiny_llama().forward).parameters
    assert cache_keyword(make_tiny_llama()) == ("cache" if "cache" in named else "past_key_values")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
@pytest.mark.parametrize("config", [GreedyConfig(max_new_tokens=12),
                                    SpeculativeConfig(draft="lookup", max_new_tokens=12, gamma=3)],
                         ids=["greedy", "speculative"])
def test_a_model_split_between_gpu_and_cpu_decodes_like_the_plain_one(plain, model_dir, config):
    """On a GPU machine: half the weights on the GPU, the rest on the CPU (float32, no TF32), token for
    token like the whole model on the CPU, timed with CUDA events on the GPU's part."""
    torch.backends.cuda.matmul.allow_tf32 = False
    size = sum(p.numel() * p.element_size() for p in plain.model.parameters())
    split = load(ModelSpec(name=model_dir, dtype="float32", device_map="auto",
                           max_memory=f"0={size // 2}B,cpu={4 * size}B"))
    assert set(split.placement) == {"cuda:0", "cpu"}, split.placement
    assert torch.device("cuda", 0) in split.cuda_devices
    ids = plain.encode(PROMPT, chat_template=False)
    got, want = runner.run(split, ids, config), runner.run(plain, ids, config)
    assert got.error is None and got.output_ids == want.output_ids
    model_ms = [sum(step.timings_ms.get(k, 0.0) for k in ("prefill", "forward", "verify")) for step in got.steps]
    assert all(ms > 0 for ms in model_ms)


@needs_cuda
def test_timer_with_real_cuda_events_measures_gpu_work():
    lm = LM(make_tiny_llama(), None, "tiny")
    lm.cuda_devices = [torch.device("cuda", 0)]
    a = torch.randn(2048, 2048, device="cuda")
    timer = Timer(lm)
    for _ in range(20):
        a = a @ a / 2048 ** 0.5
    timer.lap("forward")
    phases = timer.done()
    assert phases["forward"] > 0.05 and phases["forward"] > 10 * phases["other"]


@needs_cuda
def test_a_dropped_copy_gives_its_gpu_memory_back(model_dir):
    """Issue 47 class 6 on a GPU: when the app's model cache drops a copy (session.dropped, as the server's
    loaders do), PyTorch's cached blocks go back to the driver, not only to PyTorch's pool. Control: the same
    drop without the hand-back leaves the copy's blocks reserved."""
    import gc

    from decoding.runtime.model_cache import ModelCache
    from ui.widgets import session

    def reserved_after_drop(on_drop) -> tuple[int, int]:
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        cache = ModelCache(cap=2, on_drop=on_drop)
        lm = cache.get("copy", lambda: load(ModelSpec(name=model_dir, device="cuda", dtype="float32")))
        runner.run(lm, [3, 4, 5], GreedyConfig(max_new_tokens=4))
        held = torch.cuda.memory_reserved() - base
        del lm
        gc.collect()
        cache.drop()
        return held, torch.cuda.memory_reserved() - base

    held, left = reserved_after_drop(lambda key: (gc.collect(), session.dropped(key)))
    assert held > 4 * 2**20 and left <= held // 10, (held, left)
    held, kept = reserved_after_drop(lambda key: gc.collect())                     # control: no hand-back
    assert kept > held // 2, (held, kept)
    torch.cuda.empty_cache()
