"""Each processor equals the transformers warper of the same name, on random logits and edge cases,
and never changes its input."""
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from decoding.core.errors import ConfigError
from decoding.core.processors import MinP, Temperature, TopK, TopP, apply_tracked, build_pipeline

V = 50


def _cases():
    g = torch.Generator().manual_seed(0)
    random = torch.randn(4, V, generator=g) * 3
    ties = torch.tensor([[2.0, 2.0, 2.0, 1.0, 1.0, 0.0] + [-1.0] * (V - 6)])
    with_inf = random[:1].clone()
    with_inf[0, ::3] = float("-inf")
    flat = torch.zeros(1, V)
    return {"random": random, "ties": ties, "with_inf": with_inf, "flat": flat}


PAIRS = [
    (lambda: Temperature(0.7), lambda: TemperatureLogitsWarper(0.7)),
    (lambda: Temperature(1.5), lambda: TemperatureLogitsWarper(1.5)),
    (lambda: TopK(5), lambda: TopKLogitsWarper(5)),
    (lambda: TopK(1), lambda: TopKLogitsWarper(1)),
    (lambda: TopK(V), lambda: TopKLogitsWarper(V)),
    (lambda: TopK(V + 10), lambda: TopKLogitsWarper(V + 10)),
    (lambda: TopK(3, 2), lambda: TopKLogitsWarper(3, min_tokens_to_keep=2)),
    (lambda: TopP(0.9), lambda: TopPLogitsWarper(0.9)),
    (lambda: TopP(0.3), lambda: TopPLogitsWarper(0.3)),
    (lambda: TopP(1.0), lambda: TopPLogitsWarper(1.0)),
    (lambda: TopP(0.01, 3), lambda: TopPLogitsWarper(0.01, min_tokens_to_keep=3)),
    (lambda: MinP(0.1), lambda: MinPLogitsWarper(0.1)),
    (lambda: MinP(0.0), lambda: MinPLogitsWarper(0.0)),
    (lambda: MinP(1.0), lambda: MinPLogitsWarper(1.0)),
    (lambda: MinP(0.5, 2), lambda: MinPLogitsWarper(0.5, min_tokens_to_keep=2)),
]


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_processor_equals_transformers(case, ours, theirs):
    logits = _cases()[case]
    before = logits.clone()
    got = ours()(logits)
    want = theirs()(None, logits.clone())
    assert torch.equal(logits, before), "input changed in place"
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)])


def test_row_and_batch_agree():
    logits = _cases()["random"]
    for proc in (TopK(4), TopP(0.8), MinP(0.2), Temperature(0.5)):
        batch = proc(logits)
        for i in range(logits.shape[0]):
            assert torch.equal(proc(logits[i]), batch[i])


@pytest.mark.parametrize("params", [
    {"temperature": 0.7, "top_k": 10, "top_p": 0.9, "min_p": 0.05},
    {"temperature": 1.3, "top_p": 0.5},
    {"top_k": 3, "min_p": 0.3},
    {"temperature": 0.5},
])
def test_pipeline_equals_transformers_order(params):
    logits = _cases()["random"]
    hf = LogitsProcessorList()
    if params.get("temperature", 1.0) != 1.0:
        hf.append(TemperatureLogitsWarper(params["temperature"]))
    if params.get("top_k", 0):
        hf.append(TopKLogitsWarper(params["top_k"]))
    if params.get("top_p", 1.0) < 1.0:
        hf.append(TopPLogitsWarper(params["top_p"]))
    if params.get("min_p", 0.0) > 0:
        hf.append(MinPLogitsWarper(params["min_p"]))
    got = build_pipeline(**params)(logits)
    want = hf(None, logits.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)])


def test_negative_control_wrong_order_differs():
    """The order check has power: top-p before top-k gives a different result on some input."""
    wrong_order_seen = False
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        x = torch.randn(1, 12, generator=g) * 2
        a = build_pipeline(top_k=4, top_p=0.7)(x)
        b = TopK(4)(TopP(0.7)(x))
        wrong_order_seen |= not torch.equal(torch.isinf(a), torch.isinf(b))
    assert wrong_order_seen, "the order test cannot tell top-k->top-p from top-p->top-k"


def test_apply_tracked_names_first_remover():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    pipe = build_pipeline(top_k=4, top_p=0.9)
    applied = apply_tracked(pipe, logits)
    assert torch.equal(torch.isinf(applied.logits), applied.removed_by > 0)
    assert applied.removed_by[4] == 1 and applied.removed_by[5] == 1  # top_k removed ranks 5, 6
    assert torch.equal(applied.logits, pipe(logits))


@pytest.mark.parametrize("make,param", [
    (lambda: Temperature(0), "temperature"), (lambda: Temperature(-1), "temperature"),
    (lambda: TopK(0), "top_k"), (lambda: TopK(-3), "top_k"),
    (lambda: TopP(0), "top_p"), (lambda: TopP(1.2), "top_p"),
    (lambda: MinP(-0.1), "min_p"), (lambda: MinP(1.5), "min_p"),
])
def test_processor_validation_names_parameter(make, param):
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value).startswith(param + "=") and "\n" not in str(err.value)
