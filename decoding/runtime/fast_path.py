"""The fast path for one-sequence decoding on a GPU: the target's KV cache in tensors that never move
(transformers' StaticCache, one per slot) and its short forwards (the 1-token step, a chain's γ + 1 tokens,
a tree's nodes) captured once per row count as CUDA graphs and replayed, so that a step costs one graph
launch instead of hundreds of kernel launches from Python.

Every forward attends over the slot's whole capacity through an additive 4D mask (0 where a row may look:
the cached prefix, then its own block's `allowed` entries; the dtype's minimum elsewhere), so stale
positions past the valid length are never read and a roll-back only moves the length. A slot starts at
FIRST_CAPACITY positions and doubles (its graphs captured again) when a sequence outgrows it, up to the
FastPath's capacity, and keeps that size: a step attends over at most twice the longest sequence the slot
has held. A slot keeps its graphs across runs; a run holds it through a KVLease and gives it back when the
lease is dropped; taking a slot zeroes its keys and values (a stale NaN times a zero attention weight would
still be NaN).
Prompts (the first forward on a slot) and forwards of more than GRAPH_ROWS tokens run eagerly.

A graph runs no Python, so forward hooks do not fire inside it: the capture records the LM head's input,
the decoder's output and every decoder layer's output, and after each replay the hooks registered on those
modules at that moment are called with copies of them (the taps of decoding.runtime.hooks read there).

Off CUDA the same code runs with EmulatedGraph, which re-runs the forward and copies its outputs into the
tensors of the first run, as a replay overwrites them: the tests check the fast path's bookkeeping on
the CPU that way. The CPU itself keeps dynamic caches and its GEMM plan.
"""
from __future__ import annotations

import inspect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from decoding.core.errors import ConfigError, check

GRAPH_ROWS = 32     # forwards of at most this many tokens replay a graph; longer ones (prompts) run eagerly
SLOTS = 4           # caches kept with their graphs; a run beyond them decodes on a dynamic cache
FIRST_CAPACITY = 512    # a new slot's positions (doubled as a sequence needs, up to FastPath.capacity)
ATTENTION = ("sdpa", "eager")     # implementations that add a custom 4D float mask to the scores


class StaticKV:
    """The key/value tensors of one sequence, `capacity` positions long, of which `length` are valid."""

    def __init__(self, model, capacity: int):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        kinds = {type(layer).__name__ for layer in self.cache.layers}
        check(all(type(layer) is StaticLayer for layer in self.cache.layers), "fast_path", True,
              f"needs full attention in every layer ({getattr(model.config, 'model_type', 'this model')}'s "
              f"cache layers: {', '.join(sorted(kinds))})")
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

    @torch.inference_mode()
    def clear(self) -> None:
        """Empty: length 0, the write position with it, every key and value zero."""
        self.length = 0
        self.resync()
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys.zero_()
                layer.values.zero_()

    @torch.inference_mode()
    def grown(self, model, capacity: int) -> StaticKV:
        """A copy of this cache with room for `capacity` positions (the valid ones copied, the rest zero)."""
        bigger = StaticKV(model, capacity)
        for old, new in zip(self.cache.layers, bigger.cache.layers):
            if old.is_initialized:
                _allocate_like(new, old)
                new.keys[:, :, :self.length] = old.keys[:, :, :self.length]
                new.values[:, :, :self.length] = old.values[:, :, :self.length]
        bigger.length = self.length
        bigger.resync()
        return bigger

    def position_bytes(self) -> int:
        """Bytes of keys and values one position takes over every layer (0 before the first forward)."""
        return sum(t.element_size() * t.numel() // self.capacity for layer in self.cache.layers
                   if layer.is_initialized for t in (layer.keys, layer.values))


def _allocate_like(layer, like) -> None:
    """Allocate a StaticLayer's zero tensors with `like`'s heads, dtype and device (transformers versions
    size them from the keys alone or from the keys and the values)."""
    empty = (like.keys[:, :, :0], like.values[:, :, :0])
    takes = [p for p in inspect.signature(layer.lazy_initialization).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    layer.lazy_initialization(*empty[:len(takes)])


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
        self.kv.clear()
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
        previous = torch.cuda.current_stream()
        stream = torch.cuda.Stream()
        stream.wait_stream(previous)
        try:
            with torch.cuda.stream(stream):
                run()
                undo()
            previous.wait_stream(stream)
            with torch.cuda.graph(self.graph, pool=self.pool):
                self.outputs = run()
        finally:                    # a capture that failed in capture_end leaves its stream current, and
            torch.cuda.set_stream(previous)     # what a failed warm-up queued must precede a resync
            previous.wait_stream(stream)
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
        self.capacity = int(capacity or lm.context_length)      # the most positions a slot grows to
        self.slots: list[Slot] = []
        self.pool = graph.new_pool()
        self._lock = threading.Lock()
        self.failure: str | None = None             # why graphs were given up (forwards then run eagerly)
        self.hooks = _HookCheck(lm.model)
        StaticKV(lm.model, 1)                       # refuses a model with other cache layers now

    def describe(self) -> str:
        graphs = sum(len(slot.graphs) for slot in self.slots)
        sizes = "/".join(str(slot.kv.capacity) for slot in self.slots) or "none yet"
        slots = "1 slot" if len(self.slots) == 1 else f"{len(self.slots)} slots"
        caches = f"static caches ({slots} of {sizes} positions, up to {self.capacity})"
        if self.failure:
            return f"{caches}, no graphs ({self.failure})"
        return f"{caches} and {graphs} graphs"

    def lease(self) -> KVLease | None:
        """A free slot's cache for one run (None when all SLOTS are held: decode on a dynamic cache)."""
        with self._lock:
            for slot in self.slots:
                if slot.lease() is None:
                    return slot.take()
            if len(self.slots) < SLOTS:
                self.slots.append(Slot(StaticKV(self.lm.model, min(FIRST_CAPACITY, self.capacity))))
                return self.slots[-1].take()
        return None

    @torch.inference_mode()
    def forward(self, lease: KVLease, ids: Sequence[int], positions: Sequence[int] | None = None,
                allowed: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """Run `ids` after what the lease's cache holds (`positions`: default past + i; `allowed` (T, T):
        which block rows see which, default causal); float32 logits of the last `logits_to_keep` rows.
        A forward that raises leaves the cache as it was."""
        rows, past = len(ids), lease.kv.length
        check(past + rows <= self.capacity, "tokens", past + rows, f"exceed the fast path's cache of {self.capacity}")
        if past + rows > lease.kv.capacity:
            self._grow(lease.slot, past + rows)
        kv = lease.kv
        try:
            logits = self._run(lease.slot, ids, positions, allowed, logits_to_keep)
        except BaseException:
            kv.resync()                             # the device's write position back to the valid length
            raise
        kv.length += rows
        return logits

    def _run(self, slot: Slot, ids, positions, allowed, logits_to_keep: int) -> torch.Tensor:
        kv, rows = slot.kv, len(ids)
        past = kv.length
        positions = list(range(past, past + rows)) if positions is None else list(positions)
        allowed = causal(rows) if allowed is None else allowed
        mask = block_mask(allowed, past, kv.capacity, self.lm.dtype)
        keep = rows if logits_to_keep <= 0 else min(logits_to_keep, rows)
        replayable = 0 < past and rows <= GRAPH_ROWS and self.hooks.supported()
        captured = self._graph(slot, rows) if replayable else None
        if captured is None:
            return self._eager(kv, ids, positions, mask, keep)
        return self._replay(captured, ids, positions, mask, keep)

    def _grow(self, slot: Slot, need: int) -> None:
        """Move the slot to a cache of twice the room (or `need`'s next power of two, at most capacity);
        its graphs belong to the old tensors and are captured again as forwards need them."""
        room = min(self.capacity, max(2 * slot.kv.capacity, 1 << (need - 1).bit_length()))
        slot.kv = slot.kv.grown(self.lm.model, room)
        slot.graphs = {}

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

    def _replay(self, captured: Captured, ids, positions, mask: torch.Tensor, keep: int) -> torch.Tensor:
        captured.ids.copy_(torch.tensor([list(ids)]))
        captured.positions.copy_(torch.tensor([positions]))
        captured.mask.copy_(mask)
        outputs = captured.graph.replay()
        _call_hooks(self.hooks.tapped, outputs, keep)
        return outputs["logits"][0, -keep:].to(torch.float32, copy=True)

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


class _HookCheck:
    """Whether the model has only hooks a replay calls: the LM head's pre-hooks and the decoder's and its
    layers' forward hooks, none with kwargs, none global. Every hook registered through torch draws a new
    handle id, so a True is kept until the next id is drawn; a False is checked again each forward (those
    forwards run eagerly and a removed hook sends the next one back to its graph). Not seen: hooks put
    into a module's hook dicts by hand, and modules attached after the FastPath was built."""

    def __init__(self, model):
        self.modules = list(model.modules())
        self.tapped = _tapped(model)        # the modules whose hooks a replay calls (_call_hooks)
        self.pre = {id(module) for name, module in self.tapped if name == "head"}
        self.post = {id(module) for name, module in self.tapped if name != "head"}
        self.seen: tuple[int, bool] | None = None       # (the handle id counter, the answer then)

    def supported(self) -> bool:
        from torch.nn.modules import module as nn_module
        from torch.utils.hooks import RemovableHandle

        counter = getattr(RemovableHandle, "next_id", None)
        if counter is not None and self.seen is not None and self.seen[0] == counter:
            return self.seen[1]
        answer = not (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks) and \
            all(self._callable(module) for module in self.modules)
        self.seen = (counter, answer) if answer and counter is not None else None
        return answer

    def _callable(self, module) -> bool:
        if module._forward_hooks_with_kwargs or module._forward_pre_hooks_with_kwargs:
            return False
        return ((not module._forward_pre_hooks or id(module) in self.pre) and
                (not module._forward_hooks or id(module) in self.post))


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


def _call_hooks(tapped: list[tuple[str, torch.nn.Module]], outputs: dict[str, torch.Tensor], keep: int) -> None:
    """Call the hooks now registered on the `tapped` modules (_tapped's list) with copies of what the replay
    recorded (the LM head's input: its last `keep` rows, those an eager forward with logits_to_keep gives
    the head)."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    for name, module in tapped:
        if name == "head":
            for hook in list(module._forward_pre_hooks.values()):
                hook(module, (outputs["head"][:, -keep:].clone(),))
            continue
        for hook in list(module._forward_hooks.values()):
            value = outputs[name].clone()
            hook(module, (), BaseModelOutputWithPast(last_hidden_state=value) if name == "decoder" else value)


def fast_path_error(device: torch.device) -> ConfigError | None:
    """Why CUDA graphs cannot run on `device` (None: they can)."""
    if device.type != "cuda":
        return ConfigError("fast_path", True, f"needs a CUDA device (the model is on {device.type})")
    return None
