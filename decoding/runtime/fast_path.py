"""The fast path for one-sequence decoding on a GPU: the target's KV cache in tensors that never move
(transformers' StaticCache, one per slot) and its short forwards (the 1-token step, a chain's γ + 1 tokens,
a tree's nodes) captured once per row count as CUDA graphs and replayed, so that a step costs one graph
launch instead of hundreds of kernel launches from Python.

Every forward attends over the slot's whole capacity through an additive 4D mask (0 where a row may look:
the cached prefix, then its own block's `allowed` entries; the dtype's minimum elsewhere), so stale
positions past the valid length are never read and a roll-back only moves the length. A slot keeps its
graphs across runs; a run holds it through a KVLease and gives it back when the lease is dropped.

A graph runs no Python, so forward hooks do not fire inside it: the capture records the LM head's input,
the decoder's output and every decoder layer's output, and after each replay the hooks registered on those
modules at that moment are called with copies of them (the taps of decoding.runtime.hooks read there).

Off CUDA the same code runs with EmulatedGraph, which re-runs the forward and copies its outputs into the
tensors of the first run, as a replay overwrites them: the tests check the fast path's bookkeeping on
the CPU that way. The CPU itself keeps dynamic caches and its GEMM plan.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from decoding.core.errors import ConfigError, check

GRAPH_ROWS = 32     # forwards of at most this many tokens replay a graph; longer ones (prompts) run eagerly
SLOTS = 4           # caches kept with their graphs; a run beyond them decodes on a dynamic cache
ATTENTION = ("sdpa", "eager")     # implementations that add a custom 4D float mask to the scores


class StaticKV:
    """The key/value tensors of one sequence, `capacity` positions long, of which `length` are valid."""

    def __init__(self, model, capacity: int):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        kinds = {type(layer).__name__ for layer in self.cache.layers}
        check(all(type(layer) is StaticLayer for layer in self.cache.layers), "fast_path", True,
              f"needs full attention in every layer (this model's cache layers: {', '.join(sorted(kinds))})")
        self.capacity = capacity
        self.length = 0

    @property
    def layers(self):
        return self.cache.layers

    @torch.inference_mode()
    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last -tokens_to_remove positions (a negative count, as DynamicCache.crop takes)."""
        check(tokens_to_remove <= 0 and -tokens_to_remove <= self.length, "tokens_to_remove", tokens_to_remove,
              f"must be in [-{self.length}, 0]")
        if tokens_to_remove:
            self.rewind(-tokens_to_remove)
            self.length += tokens_to_remove

    def rewind(self, tokens: int) -> None:
        """Move the layers' own write position back by `tokens` (it lives on the device)."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.sub_(tokens)

    def resync(self) -> None:
        """Set the layers' write position to `length` (after a capture that stopped half-way)."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(self.length)

    def position_bytes(self) -> int:
        """Bytes of keys and values one position takes over every layer (0 before the first forward)."""
        return sum(t.element_size() * t.numel() // self.capacity for layer in self.cache.layers
                   if layer.is_initialized for t in (layer.keys, layer.values))


class KVLease:
    """A run's hold on one slot's cache: what strategies call on a cache (get_seq_length, crop)."""

    def __init__(self, slot: Slot):
        self.slot = slot

    @property
    def kv(self) -> StaticKV:
        return self.slot.kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.slot.kv.length

    def crop(self, tokens_to_remove: int) -> None:
        self.slot.kv.crop(tokens_to_remove)


class Slot:
    """A StaticKV with the graphs captured on it (per row count) and their input tensors."""

    def __init__(self, kv: StaticKV):
        self.kv = kv
        self.graphs: dict[int, Captured] = {}
        self.lease: Callable[[], KVLease | None] = lambda: None

    def take(self) -> KVLease:
        self.kv.crop(-self.kv.length)
        lease = KVLease(self)
        self.lease = weakref.ref(lease)
        return lease


class Captured:
    """One graph and its static inputs: ids (1, T), positions (1, T), mask (1, 1, T, capacity)."""

    def __init__(self, graph, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        self.graph, self.ids, self.positions, self.mask = graph, ids, positions, mask
        self.outputs: dict[str, torch.Tensor] = {}


class CudaGraph:
    """torch.cuda.CUDAGraph: a warm-up run on a side stream (then undone), the capture, replays."""

    def __init__(self, pool):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool
        self.outputs: dict[str, torch.Tensor] = {}

    @staticmethod
    def new_pool():
        """The memory pool one FastPath's graphs share (they never replay at once)."""
        return torch.cuda.graph_pool_handle()

    def capture(self, run: Callable[[], dict], undo: Callable[[], None]) -> dict[str, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
            undo()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.outputs = run()
        return self.outputs

    def replay(self) -> dict[str, torch.Tensor]:
        self.graph.replay()
        return self.outputs


class EmulatedGraph:
    """A graph's behaviour without CUDA: the capture changes no state and its outputs are the tensors that
    every replay overwrites."""

    def __init__(self, pool=None):
        self.run: Callable[[], dict] | None = None
        self.outputs: dict[str, torch.Tensor] = {}

    @staticmethod
    def new_pool():
        return None

    def capture(self, run: Callable[[], dict], undo: Callable[[], None]) -> dict[str, torch.Tensor]:
        self.run = run
        self.outputs = run()
        undo()
        return self.outputs

    def replay(self) -> dict[str, torch.Tensor]:
        for name, fresh in self.run().items():
            self.outputs[name].copy_(fresh)
        return self.outputs


def block_mask(allowed: torch.Tensor, past: int, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, T, capacity): 0 over the cached prefix and where `allowed` (T, T) is true in
    the block after it; the dtype's minimum elsewhere."""
    rows = allowed.shape[0]
    mask = torch.full((rows, capacity), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :past] = 0
    mask[:, past:past + rows].masked_fill_(allowed.cpu(), 0)
    return mask[None, None]


def causal(rows: int) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool).tril()


def check_model(lm) -> None:
    """Refuse models the fast path cannot run: placed across devices, or an attention without 4D masks."""
    check(not lm.placement, "fast_path", True, "needs the whole model on one device (not a device_map)")
    impl = getattr(lm.model.config, "_attn_implementation", None)
    check(impl in ATTENTION, "fast_path", True, f"needs attention {' or '.join(ATTENTION)} (this model: {impl})")


class FastPath:
    """The slots and graphs of one LM. `graph` builds a graph (CudaGraph on CUDA, EmulatedGraph in tests)."""

    def __init__(self, lm, graph: type = CudaGraph, capacity: int | None = None):
        check_model(lm)
        self.lm = lm
        self.graph = graph
        self.capacity = int(capacity or lm.context_length)
        self.slots: list[Slot] = []
        self.pool = graph.new_pool()
        self._lock = threading.Lock()
        self.failure: str | None = None             # why graphs were given up (forwards then run eagerly)
        StaticKV(lm.model, 1)                       # refuses a model with other cache layers now

    def describe(self) -> str:
        graphs = sum(len(slot.graphs) for slot in self.slots)
        if self.failure:
            return f"static caches, no graphs ({self.failure})"
        return f"static caches of {self.capacity} and {graphs} graphs in {len(self.slots)} slots"

    def lease(self) -> KVLease | None:
        """A free slot's cache for one run (None when all SLOTS are held: decode on a dynamic cache)."""
        with self._lock:
            for slot in self.slots:
                if slot.lease() is None:
                    return slot.take()
            if len(self.slots) < SLOTS:
                self.slots.append(Slot(StaticKV(self.lm.model, self.capacity)))
                return self.slots[-1].take()
        return None

    @torch.inference_mode()
    def forward(self, lease: KVLease, ids: Sequence[int], positions: Sequence[int] | None = None,
                allowed: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """Run `ids` after what the lease's cache holds (`positions`: default past + i; `allowed` (T, T):
        which block rows see which, default causal); float32 logits of the last `logits_to_keep` rows."""
        kv, rows = lease.kv, len(ids)
        past = kv.length
        check(past + rows <= kv.capacity, "tokens", past + rows, f"exceed the fast path's cache of {kv.capacity}")
        positions = list(range(past, past + rows)) if positions is None else list(positions)
        allowed = causal(rows) if allowed is None else allowed
        mask = block_mask(allowed, past, kv.capacity, self.lm.dtype)
        keep = rows if logits_to_keep <= 0 else min(logits_to_keep, rows)
        captured = self._graph(lease.slot, rows) if rows <= GRAPH_ROWS and _hooks_supported(self.lm.model) else None
        if captured is not None:
            logits = self._replay(captured, ids, positions, mask)[-keep:]
        else:
            logits = self._eager(kv, ids, positions, mask, keep)
        kv.length += rows
        return logits

    def _eager(self, kv: StaticKV, ids, positions, mask: torch.Tensor, keep: int) -> torch.Tensor:
        device = self.lm.device
        out = self.lm.model(input_ids=torch.tensor([list(ids)], device=device), attention_mask=mask.to(device),
                            position_ids=torch.tensor([positions], device=device), use_cache=True,
                            **{self.lm.cache_kw: kv.cache}, logits_to_keep=keep)
        return out.logits[0].float()

    def _graph(self, slot: Slot, rows: int) -> Captured | None:
        """The slot's graph for `rows` tokens, captured now if needed (None once a capture has failed)."""
        if self.failure is None and rows not in slot.graphs:
            try:
                slot.graphs[rows] = self._capture(slot, rows)
            except RuntimeError as err:             # the forward runs eagerly from now on, on the same cache
                if "out of memory" in str(err).lower():
                    raise
                slot.kv.resync()
                self.failure = f"capture of {rows} rows failed: {str(err).strip().splitlines()[0][:160]}"
        return None if self.failure else slot.graphs[rows]

    def _replay(self, captured: Captured, ids, positions, mask: torch.Tensor) -> torch.Tensor:
        captured.ids.copy_(torch.tensor([list(ids)]))
        captured.positions.copy_(torch.tensor([positions]))
        captured.mask.copy_(mask)
        outputs = captured.graph.replay()
        _call_hooks(self.lm.model, outputs)
        return outputs["logits"][0].to(torch.float32, copy=True)

    def _capture(self, slot: Slot, rows: int) -> Captured:
        device, kv = self.lm.device, slot.kv
        captured = Captured(self.graph(self.pool), torch.zeros(1, rows, dtype=torch.long, device=device),
                            torch.zeros(1, rows, dtype=torch.long, device=device),
                            torch.zeros(1, 1, rows, kv.capacity, dtype=self.lm.dtype, device=device))

        def run() -> dict[str, torch.Tensor]:
            with _recording(self.lm.model) as record:
                out = self.lm.model(input_ids=captured.ids, attention_mask=captured.mask,
                                    position_ids=captured.positions, use_cache=True,
                                    **{self.lm.cache_kw: kv.cache})
            return {"logits": out.logits, **record}

        captured.outputs = captured.graph.capture(run, lambda: kv.rewind(rows))
        return captured


def _tapped(model) -> list[tuple[str, torch.nn.Module]]:
    """The modules whose hooks the fast path calls after a replay: the LM head, the decoder, its layers."""
    decoder = model.get_decoder()
    return [("head", model.get_output_embeddings()), ("decoder", decoder)] + \
        [(f"layer{i}", layer) for i, layer in enumerate(decoder.layers)]


def _hooks_supported(model) -> bool:
    """No module of the model has hooks the replay cannot call (with kwargs, or on other modules)."""
    tapped = {id(module) for _, module in _tapped(model)}
    for module in model.modules():
        hooked = module._forward_hooks or module._forward_pre_hooks
        if hooked and (id(module) not in tapped or module._forward_hooks_with_kwargs
                       or module._forward_pre_hooks_with_kwargs or module._forward_hooks_always_called):
            return False
    return True


class _recording:
    """While a graph's forward runs: the tapped modules' own hooks set aside, recorders in their place;
    yields the dict the recorders fill (head: the LM head's input; decoder, layerN: outputs)."""

    def __init__(self, model):
        self.modules = _tapped(model)
        self.record: dict[str, torch.Tensor] = {}
        self.saved: list[tuple[OrderedDict, OrderedDict]] = []

    def __enter__(self) -> dict[str, torch.Tensor]:
        for name, module in self.modules:
            self.saved.append((module._forward_pre_hooks, module._forward_hooks))
            module._forward_pre_hooks, module._forward_hooks = OrderedDict(), OrderedDict()
            if name == "head":
                module.register_forward_pre_hook(lambda _m, args: self.record.__setitem__("head", args[0]))
            else:
                module.register_forward_hook(lambda _m, _a, out, name=name: self.record.__setitem__(name, _first(out)))
        return self.record

    def __exit__(self, *exc) -> None:
        for (_, module), (pre, post) in zip(self.modules, self.saved):
            module._forward_pre_hooks, module._forward_hooks = pre, post


def _first(output) -> torch.Tensor:
    """A module's main output tensor: the decoder's last_hidden_state, a layer's hidden states."""
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0] if isinstance(output, tuple) else output


def _call_hooks(model, outputs: dict[str, torch.Tensor]) -> None:
    """Call the hooks now registered on the tapped modules with copies of what the replay recorded."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    for name, module in _tapped(model):
        if name == "head":
            for hook in list(module._forward_pre_hooks.values()):
                hook(module, (outputs["head"].clone(),))
            continue
        for hook in list(module._forward_hooks.values()):
            value = outputs[name].clone()
            hook(module, (), BaseModelOutputWithPast(last_hidden_state=value) if name == "decoder" else value)


def fast_path_error(device: torch.device) -> ConfigError | None:
    """Why CUDA graphs cannot run on `device` (None: they can)."""
    if device.type != "cuda":
        return ConfigError("fast_path", True, f"needs a CUDA device (the model is on {device.type})")
    return None
