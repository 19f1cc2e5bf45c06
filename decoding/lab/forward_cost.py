"""Cost of a forward, measured: the target's wall time over n new tokens after a cached prefix and over
b sequences of one new token each, the device's memory bandwidth and matrix-product rate, and the
model's shape for the roofline (decoding.core.roofline)."""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from decoding.core.errors import ConfigError, check
from decoding.core.measures import CostConfig, DeviceRates, ForwardTime
from decoding.core.roofline import ModelShape
from decoding.runtime.cost_table import forward_times
from decoding.runtime.kv_rollback import roll_back, rollback_cache
from decoding.runtime.models import free_device_memory, is_out_of_memory


def model_shape(lm) -> ModelShape:
    """The loaded model's shape: every linear layer's weights (a tied LM head counted once in the bytes
    read, twice in the products), its layers and attention widths from the config."""
    config = lm.model.config.get_text_config()
    linears = [m.weight for m in lm.model.modules() if isinstance(m, nn.Linear)]
    unique = {w.data_ptr(): w.numel() * w.element_size() for w in linears}
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return ModelShape(linear_params=sum(w.numel() for w in linears), weight_bytes=sum(unique.values()),
                      layers=int(config.num_hidden_layers), q_dim=heads * head_dim, kv_dim=kv_heads * head_dim,
                      element_bytes=torch.finfo(lm.dtype).bits // 8)


def _timed(lm, fn, repeats: int) -> tuple[float, ...]:
    """Wall times in ms of `repeats` calls of fn after one untimed warm-up call, the device synchronised."""
    fn()
    times = []
    for _ in range(repeats):
        lm.sync()
        start = time.perf_counter()
        fn()
        lm.sync()
        times.append((time.perf_counter() - start) * 1000.0)
    return tuple(times)


def device_rates(lm, repeats: int = 5) -> DeviceRates:
    """The device's rates as this model's forwards see them (this process's threads, the model's dtype
    and kernels): bytes/s reading 256 MiB (1 GiB on CUDA) once, and FLOP/s of the model's largest
    per-layer linear (the LM head aside) over 1024 rows (8192 on CUDA). The best of the repeats, and the
    slowest repeat's rates beside them (their spread: how firmly they place the ridge)."""
    cuda = lm.device.type == "cuda"
    read_bytes = (1 << 30) if cuda else (256 << 20)
    rows = 8192 if cuda else 1024
    _, layer = _largest_layer_linear(lm)
    with torch.inference_mode():
        data = torch.ones(read_bytes // 4, dtype=torch.float32, device=lm.device)
        read_ms = _timed(lm, data.sum, repeats)
        del data
        x = torch.randn(rows, layer.in_features, dtype=layer.weight.dtype, device=layer.weight.device)
        product_ms = _timed(lm, lambda: layer(x), repeats)
    flops = 2 * rows * layer.in_features * layer.out_features
    return DeviceRates(bytes_per_s=read_bytes / (min(read_ms) / 1000), flops_per_s=flops / (min(product_ms) / 1000),
                       read_bytes=read_bytes,
                       product=f"one layer's largest matrix ({layer.out_features}×{layer.in_features}) × {rows} rows",
                       bytes_per_s_low=read_bytes / (max(read_ms) / 1000),
                       flops_per_s_low=flops / (max(product_ms) / 1000))


def _largest_layer_linear(lm) -> tuple[str, nn.Linear]:
    """The linear with the most weights among those whose output is not the vocabulary."""
    linears = [(name, m) for name, m in lm.model.named_modules()
               if isinstance(m, nn.Linear) and m.out_features != lm.vocab_size]
    check(bool(linears), "model", lm.name, "has no linear layers to measure the FLOP rate on")
    return max(linears, key=lambda item: item[1].weight.numel())


def batch_times(lm, batches, repeats: int, prefix_tokens: int) -> Iterator[ForwardTime]:
    """Per batch size b: wall times of a forward over b sequences of one new token after a cached prefix
    of `prefix_tokens` each (the last position's logits only, as greedy decoding needs)."""
    for b in batches:
        rows = torch.tensor([[(7 * i + 3 + r) % lm.vocab_size for i in range(prefix_tokens + 1)]
                             for r in range(b)], dtype=torch.long)
        cache = rollback_cache(lm.new_cache())            # a sliding window drops the step again too
        lm.forward_rows(rows[:, :prefix_tokens], cache)

        def step(new=rows[:, prefix_tokens:], cache=cache):
            lm.forward_rows(new, cache)
            roll_back(cache, prefix_tokens)

        times = _timed(lm, step, repeats)
        yield ForwardTime("batch", b, times)


def measure_cost(lm, config: CostConfig | None = None) -> Iterator[ModelShape | DeviceRates | ForwardTime]:
    """The model's shape, the device's rates, then one ForwardTime per n in config.tokens and per b in
    config.batches. A point beyond the context or the device's memory is a ConfigError naming it."""
    config = config or CostConfig()
    check(config.prefix_tokens + max(config.tokens) <= lm.context_length, "tokens", max(config.tokens),
          f"with prefix_tokens {config.prefix_tokens} must fit the model's context of {lm.context_length} tokens")
    yield model_shape(lm)
    yield device_rates(lm)
    token_points = (ForwardTime("tokens", n, tuple(times))
                    for n, times in forward_times(lm, config.tokens, config.repeats, config.prefix_tokens))
    yield from within_memory(lm, "tokens", config.tokens, token_points)
    yield from within_memory(lm, "batches", config.batches,
                              batch_times(lm, config.batches, config.repeats, config.prefix_tokens))


def within_memory(lm, param: str, values: tuple[int, ...], points: Iterator) -> Iterator:
    """`points` (one per value), with an out-of-memory error turned into a ConfigError naming `param`
    and the value that did not fit."""
    done = 0
    try:
        for point in points:
            done += 1
            yield point
    except (RuntimeError, MemoryError) as err:
        if not (isinstance(err, MemoryError) or is_out_of_memory(err)):
            raise
        free_device_memory()
        raise ConfigError(param, values[min(done, len(values) - 1)],
                          f"does not fit in memory on {lm.device}; measure fewer or smaller points") from None
