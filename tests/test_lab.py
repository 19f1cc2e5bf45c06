"""The Lab's engine side: the roofline arithmetic against torch's own FLOP counter and the cache's real
tensors, the measurements on a tiny llama (what they yield, what they refuse), and batched greedy
decoding against the strategies' greedy run. Negative controls: a FLOP formula without attention and a
KV figure that ignores grouped-query attention fail their oracles; a sampled run differs from the batch."""
from __future__ import annotations

import math
import statistics

import pytest
import torch
from batch_support import batches_up_to
from conftest import TEST_DEVICE, on_test_device
from torch.utils.flop_counter import FlopCounterMode

from decoding import GreedyConfig, SampleConfig, run
from decoding.core.errors import ConfigError
from decoding.core.formulas import flattening_point, needed_acceptance, percentile
from decoding.core.measures import BatchDecode, CostConfig, DeviceRates, ForwardTime, ThroughputConfig
from decoding.core.roofline import (
    ModelShape,
    bound_by,
    forward_bytes,
    forward_flops,
    ridge_intensity,
    ridge_tokens,
    roofline_ms,
)
from decoding.lab import forward_cost
from decoding.lab.forward_cost import measure_cost, model_shape
from decoding.lab.throughput import decode_batch, measure_throughput
from decoding.runtime.models import LM


def gqa_llama(eager: bool = True):
    """A tiny llama with grouped-query attention (4 heads, 2 key/value heads) and a tied LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if eager:
        cfg._attn_implementation = "eager"         # attention as bmm, which the FLOP counter sees
    return LM(on_test_device(LlamaForCausalLM(cfg).eval()), tokenizer=None, name="gqa")


@pytest.fixture(scope="module")
def gqa_lm():
    return gqa_llama()


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


# ---------------------------------------------------------------- the arithmetic
SHAPE = ModelShape(linear_params=1000, weight_bytes=4000, layers=2, q_dim=8, kv_dim=4, element_bytes=2)


def test_forward_arithmetic_by_hand():
    # 3 new tokens after 5 cached: 2·1000·3 + 4·2·8·3·8 = 6000 + 1536
    assert forward_flops(SHAPE, 3, 5) == 7536
    assert forward_flops(SHAPE, 3, 5, batch=2) == 2 * 7536
    assert SHAPE.kv_bytes_per_token == 2 * 2 * 4 * 2 == 32
    assert forward_bytes(SHAPE, 3, 5) == 4000 + 8 * 32
    assert forward_bytes(SHAPE, 1, 5, batch=3) == 4000 + 3 * 6 * 32
    # 10 FLOP/s and 1000 B/s: computing 7536 FLOPs takes 753.6 s, reading 4256 bytes 4.256 s
    assert roofline_ms(7536, 4256, 10, 1000) == pytest.approx(753_600)
    assert bound_by(7536, 4256, 10, 1000) == "compute"
    assert bound_by(7536, 4256, 1e9, 1000) == "memory"
    assert ridge_intensity(100, 4) == 25


@pytest.mark.parametrize("rates", [(1e3, 1e3), (3e4, 1e3), (1e6, 1e3), (1e9, 1.0)])
def test_ridge_tokens_is_the_first_compute_bound_n(rates):
    flops_per_s, bytes_per_s = rates
    first = next((n for n in range(1, 5000) if bound_by(forward_flops(SHAPE, n, 7), forward_bytes(SHAPE, n, 7),
                                                         flops_per_s, bytes_per_s) == "compute"), None)
    assert ridge_tokens(SHAPE, 7, flops_per_s, bytes_per_s, limit=4999) == first


def test_needed_acceptance_solves_the_chain_sum():
    assert needed_acceptance(1.75, 2) == pytest.approx(0.5, abs=1e-8)     # 1 + 1/2 + 1/4
    for tau, gamma in ((1.3, 1), (2.0, 4), (3.7, 8), (8.9, 8)):
        alpha = needed_acceptance(tau, gamma)
        assert 1 + sum(alpha ** k for k in range(1, gamma + 1)) == pytest.approx(tau, abs=1e-7)
    assert needed_acceptance(1.0, 3) == 0.0
    assert needed_acceptance(9.01, 8) is None          # beyond γ + 1 tokens per round


def test_percentile_matches_the_inclusive_quantiles():
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.5, 11.0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for q in (1, 25, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(cuts[q - 1])
    assert percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_flattening_point():
    assert flattening_point([1, 2, 4, 8], [10, 19, 36, 37]) == 4     # 4 -> 8 gains 3 %
    assert flattening_point([1, 4, 16], [10, 30, 80]) is None         # ≥ 10 % per doubling throughout
    assert flattening_point([1, 4], [10, 11.5]) == 1                  # 15 % over two doublings


# ---------------------------------------------------------------- the model's shape, against torch
def test_flops_match_torch_flop_counter(gqa_lm):
    shape = model_shape(gqa_lm)
    cache = gqa_lm.new_cache()
    gqa_lm.forward(list(range(10)), cache)
    counted = counted_flops(lambda: gqa_lm.forward(list(range(5)), cache))
    assert counted == forward_flops(shape, 5, 10)
    rows = torch.zeros(3, 10, dtype=torch.long)
    batch_cache = gqa_lm.new_cache()
    gqa_lm.forward_rows(rows, batch_cache)
    counted = counted_flops(lambda: gqa_lm.forward_rows(rows[:, :1], batch_cache, logits_to_keep=0))
    assert counted == forward_flops(shape, 1, 10, batch=3)
    # negative control: the products alone (no attention) miss what the counter sees
    without_attention = ModelShape(shape.linear_params, shape.weight_bytes, 0, shape.q_dim, shape.kv_dim,
                                   shape.element_bytes)
    assert forward_flops(without_attention, 5, 10) != counted_flops(lambda: gqa_lm.forward(list(range(5)),
                                                                                         gqa_lm.new_cache()))


def test_shape_bytes_match_the_weights_and_the_cache(gqa_lm):
    shape = model_shape(gqa_lm)
    model = gqa_lm.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()   # tied
    linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert shape.linear_params == sum(w.numel() for w in linear)
    assert shape.weight_bytes == sum(w.numel() * w.element_size() for w in linear)
    # every parameter is read once but the norms' few weights (the tied embedding is the LM head's)
    norms = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "norm" in name)
    assert shape.weight_bytes == sum(p.numel() * p.element_size() for p in model.parameters()) - norms
    cache = gqa_lm.new_cache()
    gqa_lm.forward_rows(torch.zeros(3, 11, dtype=torch.long), cache)
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == 3 * 11 * shape.kv_bytes_per_token
    # negative control: key/value width taken as the query width (no grouped-query attention)
    no_gqa = ModelShape(shape.linear_params, shape.weight_bytes, shape.layers, shape.q_dim, shape.q_dim,
                        shape.element_bytes)
    assert 3 * 11 * no_gqa.kv_bytes_per_token != held


# ---------------------------------------------------------------- the measurements
def test_measure_cost_yields_shape_rates_then_each_point(gqa_lm):
    config = CostConfig(tokens=(4, 1, 2), batches=(3, 1), prefix_tokens=8, repeats=2)
    events = list(measure_cost(gqa_lm, config))
    assert len(events) == config.points
    assert events[0] == model_shape(gqa_lm)
    assert isinstance(events[1], DeviceRates) and events[1].bytes_per_s > 0 and events[1].flops_per_s > 0
    points = events[2:]
    assert [(p.axis, p.n) for p in points] == [("tokens", 1), ("tokens", 2), ("tokens", 4), ("batch", 1), ("batch", 3)]
    assert all(isinstance(p, ForwardTime) and len(p.times_ms) == 2 and p.ms > 0 for p in points)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tokens": ()}, "tokens"), ({"tokens": (0, 2)}, "tokens"), ({"tokens": (1, 257)}, "tokens"),
    ({"batches": (True,)}, "batches"), ({"batches": [1, 2.5]}, "batches"), ({"repeats": 0}, "repeats"),
    ({"prefix_tokens": 0}, "prefix_tokens"),
])
def test_cost_config_names_the_bad_parameter(kwargs, param):
    with pytest.raises(ConfigError) as err:
        CostConfig(**kwargs)
    assert err.value.param == param


def test_points_beyond_the_context_are_refused_before_measuring(gqa_lm):
    with pytest.raises(ConfigError) as err:
        next(measure_cost(gqa_lm, CostConfig(tokens=(1, 120), prefix_tokens=32)))
    assert err.value.param == "tokens" and "context of 128" in str(err.value)
    with pytest.raises(ConfigError) as err:
        next(measure_throughput(gqa_lm, list(range(100)), ThroughputConfig(steps=40)))
    assert err.value.param == "steps"


def test_out_of_memory_names_the_point_and_other_errors_pass(gqa_lm, monkeypatch):
    monkeypatch.setattr(forward_cost, "batch_times", batches_up_to(4))
    events = []
    with pytest.raises(ConfigError) as err:
        for event in measure_cost(gqa_lm, CostConfig(tokens=(1,), batches=(1, 2, 4, 8), repeats=1)):
            events.append(event)
    assert err.value.param == "batches" and err.value.value == 4 and "does not fit in memory" in str(err.value)
    assert [e.n for e in events if isinstance(e, ForwardTime) and e.axis == "batch"] == [1, 2]

    def broken(lm, batches, repeats, prefix_tokens):
        raise RuntimeError("shape mismatch")
        yield

    monkeypatch.setattr(forward_cost, "batch_times", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        list(measure_cost(gqa_lm, CostConfig(tokens=(1,), batches=(1,), repeats=1)))


@pytest.mark.parametrize("batch", [1, 3])
def test_batched_greedy_decodes_what_greedy_decodes(tiny_lm, batch):
    prompt = [5, 9, 2, 7, 7, 1]
    result = decode_batch(tiny_lm, prompt, batch, steps=6)
    assert len(result.step_ms) == 6 and len(result.tokens) == 8
    greedy = run(tiny_lm, prompt, GreedyConfig(max_new_tokens=8))
    assert result.tokens == greedy.output_ids
    # negative control: a sampled run is not what the batch decoded
    sampled = run(tiny_lm, prompt, SampleConfig(temperature=2.0, max_new_tokens=8, seed=3))
    assert result.tokens != sampled.output_ids


def test_measure_throughput_yields_one_point_per_batch(tiny_lm):
    results = list(measure_throughput(tiny_lm, [3, 4, 5], ThroughputConfig(batches=(4, 1), steps=3)))
    assert [r.batch for r in results] == [1, 4]
    for r in results:
        assert len(r.step_ms) == 3
        assert r.tokens_per_s == pytest.approx(1000 * r.batch * 3 / sum(r.step_ms))
        assert r.latency_ms(50) == pytest.approx(statistics.median(r.step_ms))


def test_batch_decode_figures():
    r = BatchDecode(batch=4, step_ms=(10.0, 20.0, 30.0, 40.0), tokens=(1, 2))
    assert r.tokens_per_s == pytest.approx(1000 * 16 / 100)
    assert r.latency_ms(50) == 25.0 and r.latency_ms(100) == 40.0
    assert math.isclose(r.latency_ms(99), 30 + 10 * 0.97)


@pytest.mark.skipif(TEST_DEVICE.type != "cpu", reason="the rates' sizes are the CPU's")
def test_device_rates_on_this_cpu(gqa_lm):
    rates = forward_cost.device_rates(gqa_lm, repeats=1)
    assert rates.read_bytes == 256 << 20 and "× 1024 rows" in rates.product
    assert 1e8 < rates.bytes_per_s < 1e13 and 1e6 < rates.flops_per_s < 1e15

