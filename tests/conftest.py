"""Shared fixtures: tiny random llamas (built here, no download) and the embedded model (loaded once)."""
from __future__ import annotations

import os

import pytest
import torch

# `make test` runs the suite in TEST_WORKERS processes (pytest-xdist): each worker gets its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

# Where the tiny-model tests run: DECODESCOPE_TEST_DEVICE=cuda and DECODESCOPE_TEST_DTYPE=float16 or
# bfloat16 move every tiny model there (scripts/gpu_check.sh does). Default: cpu, float32.
TEST_DEVICE = torch.device(os.environ.get("DECODESCOPE_TEST_DEVICE", "cpu"))
TEST_DTYPE = {"float32": torch.float32, "float16": torch.float16,
              "bfloat16": torch.bfloat16}[os.environ.get("DECODESCOPE_TEST_DTYPE", "float32")]
# The largest |logit difference| accepted where one number is computed two ways (KV cache vs a full
# recomputation, a tree forward vs per-path forwards, a compacted or rolled-back cache vs a fresh
# prefill). float32: each test's own bound (1e-5 or 1e-4; measured <= 1e-6). Half precision rounds
# activations to 11 (float16) or 8 (bfloat16) significant bits, at other places in the two
# computations (other shapes, other kernels). Measured on the tiny models (|logits| <= 1.5, on the
# CPU): float16 <= 2e-3 (two float16 steps at 1.5), bfloat16 <= 7.8e-3 (one bfloat16 step). The
# bounds are about ten float16 steps and four bfloat16 steps. The negative controls that plant a wrong mask or a
# stale cache entry (3e-2 and more) stay above them; the one that plants sequential positions (7e-4) does not, so
# the negative controls run in float32 only (scripts/gpu_check.sh).
HALF_LOGIT_ATOL = {torch.float16: 0.01, torch.bfloat16: 0.03}
if TEST_DEVICE.type == "cuda":       # exactness in float32 means IEEE float32 matmuls, not TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def logit_atol(float32_bound: float) -> float:
    """A test's logit tolerance under the test dtype (its float32 bound unchanged in float32)."""
    return HALF_LOGIT_ATOL.get(TEST_DTYPE, float32_bound)


def on_test_device(model):
    return model.to(device=TEST_DEVICE, dtype=TEST_DTYPE)


def make_tiny_llama(vocab_size: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4,
                    seed: int = 0, eos_token_id: int | None = None, context: int = 256):
    """A random LlamaForCausalLM small enough for exhaustive tests (sdpa), on the test device and dtype."""
    from bench.tiny_model import tiny_llama

    return on_test_device(tiny_llama(vocab_size=vocab_size, hidden=hidden, layers=layers, heads=heads, seed=seed,
                                     eos_token_id=eos_token_id, context=context))


@pytest.fixture(scope="session")
def tiny_lm():
    from decoding.runtime.models import LM

    return LM(make_tiny_llama(), tokenizer=None, name="tiny")


@pytest.fixture(scope="module")
def lm():
    """The usual tiny model of a module's tests: tests/dspark_helpers.py's varied_llama(seed=0), a fresh one per
    module (a test may change it). A module that needs another model defines its own `lm`."""
    from dspark_helpers import varied_llama

    return varied_llama(seed=0)


@pytest.fixture(scope="session")
def real_lm():
    """The embedded SmolLM2-135M-Instruct (first load converts the GGUF, later loads are fast)."""
    from decoding.runtime.models import ModelSpec, load

    return load(ModelSpec())


@pytest.fixture(autouse=True)
def _engine_thread_off_after_each_test():
    """app.py enables the engine thread (decoding/runtime/engine_thread.py); an AppTest that ran it must not
    leave it on for the tests after it."""
    yield
    from decoding.runtime.engine_thread import ENGINE

    ENGINE.disable()


@pytest.fixture(autouse=True)
def _no_head_start(monkeypatch):
    """The Playground's pause before a step's details (ui/widgets/stepper.py, HEAD_START_S) lets a browser paint
    the new token first; AppTest has no browser, and its runs would only be slower."""
    import sys

    stepper = sys.modules.get("ui.widgets.stepper")
    if stepper is None:
        try:
            from ui.widgets import stepper
        except ImportError:          # no streamlit where only the engine is installed
            return
    monkeypatch.setattr(stepper, "HEAD_START_S", 0.0)


def pytest_collection_modifyitems(config, items):
    """Every test on the embedded model (`real`) or in a browser (`browser`) is `slow` too: `make test-fast`
    (-m "not slow") runs the rest, the full suite runs all."""
    for item in items:
        if item.get_closest_marker("real") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny app model's folder, the app's model (DECODESCOPE_MODEL) for the module's tests."""
    from bench.tiny_model import build_tiny_model_dir

    path = build_tiny_model_dir(tmp_path_factory.mktemp("tiny_app_model"))
    old = os.environ.get("DECODESCOPE_MODEL")
    os.environ["DECODESCOPE_MODEL"] = str(path)
    yield path
    if old is None:
        os.environ.pop("DECODESCOPE_MODEL", None)
    else:
        os.environ["DECODESCOPE_MODEL"] = old
