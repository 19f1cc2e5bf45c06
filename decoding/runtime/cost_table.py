"""Verify-cost table for adaptive γ: milliseconds of one target forward over n new tokens (after a
cached prefix), for n = 1..N, and what a DSpark round costs besides (`overhead_ms`: drafting,
selection, acceptance, cache; 0 when a file does not say). Profiled on the device (`profile_verify_cost`)
or fixed from a JSON file so seeded runs are reproducible."""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from numbers import Real
from pathlib import Path

from decoding.core.errors import ConfigError, check
from decoding.runtime.files import keep_recent, load_from_cache, save_to_cache, touch, write_text_atomic
from decoding.runtime.paths import cache_dir, model_key, safe_name, shown_path

COST_TABLE_VERSION = 1
MAX_COST_BYTES = 1 << 20        # a cost-table file (or upload) larger than this is refused before parsing
MAX_COST_ENTRIES = 1024         # verify_ms entries; a run verifies at most DSPARK_MAX_BUDGET + 1 tokens


@dataclass(frozen=True)
class CostTable:
    verify_ms: tuple[float, ...]     # verify_ms[n - 1]: ms of a forward over n new tokens
    source: str = "profiled"         # "profiled", the name of the file it was read from, or AUTO_SOURCE
    device: str = ""
    model: str = ""
    overhead_ms: float = 0.0         # ms a DSpark round spends outside its verification forward

    def __post_init__(self):
        object.__setattr__(self, "verify_ms", tuple(self.verify_ms))
        check(isinstance(self.overhead_ms, Real) and not isinstance(self.overhead_ms, bool)
              and 0 <= self.overhead_ms < 1e7, "overhead_ms", self.overhead_ms,
              "overhead_ms must be a number of milliseconds >= 0")
        object.__setattr__(self, "overhead_ms", float(self.overhead_ms))
        count = len(self.verify_ms)
        check(1 <= count <= MAX_COST_ENTRIES, "cost_table", f"<{count} entries>",
              f"needs 1 to {MAX_COST_ENTRIES} entries")
        check(all(isinstance(v, Real) and not isinstance(v, bool) and v == v and 0 < v < 1e7
                  for v in self.verify_ms), "cost_table", self.verify_ms if count <= 8 else f"<{count} entries>",
              "entries must be positive milliseconds")

    @property
    def max_tokens(self) -> int:
        return len(self.verify_ms)

    def ms(self, n_tokens: int) -> float:
        check(isinstance(n_tokens, int) and 1 <= n_tokens <= self.max_tokens, "cost_table",
              f"<{self.max_tokens} entries>", f"has no entry for {n_tokens} tokens")
        return float(self.verify_ms[n_tokens - 1])

    def to_dict(self) -> dict:
        return {"version": COST_TABLE_VERSION, **asdict(self), "verify_ms": list(self.verify_ms)}

    @classmethod
    def from_dict(cls, data: dict, source: str | None = None) -> CostTable:
        check(isinstance(data, dict) and data.get("version") == COST_TABLE_VERSION, "cost_table",
              source or "<dict>", f"must be a JSON object with version {COST_TABLE_VERSION}")
        check(isinstance(data.get("verify_ms"), list), "cost_table", source or "<dict>",
              "needs a list 'verify_ms' (ms per number of tokens verified, from 1 token)")
        return cls(verify_ms=tuple(data["verify_ms"]), source=source or data.get("source", "dict"),
                   device=str(data.get("device", "")), model=str(data.get("model", "")),
                   overhead_ms=data.get("overhead_ms", 0.0))

    @classmethod
    def parse(cls, data: bytes | str, source: str) -> CostTable:
        """A table from its JSON text; anything else is one line naming `source`."""
        try:
            parsed = json.loads(data)
        except RecursionError:
            raise ConfigError("cost_table", source, "could not be read (JSON nested too deeply)") from None
        except ValueError as err:
            raise ConfigError("cost_table", source, f"could not be read ({err})") from None
        try:
            return cls.from_dict(parsed, source=source)
        except ConfigError as err:                 # name the file, not the entries
            raise ConfigError("cost_table", source, err.expected) from None

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """The table in a JSON file; a file over MAX_COST_BYTES is refused after reading that much."""
        shown = shown_path(path)                   # an upload or the auto table: by its name alone
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_COST_BYTES + 1)
        except OSError as err:
            raise ConfigError("cost_table", shown, f"could not be read ({err.strerror or err})") from None
        check(len(data) <= MAX_COST_BYTES, "cost_table", shown, f"is over {MAX_COST_BYTES} bytes")
        try:
            return cls.parse(data, Path(path).name)         # its source: the name alone, never a folder
        except ConfigError as err:
            raise ConfigError("cost_table", shown, err.expected) from None

    def save(self, path: str | Path) -> None:
        """Write atomically (a temporary file renamed over `path`), so that a session reading the
        cached table while another writes it never sees half a file."""
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")


def profile_verify_cost(lm, max_tokens: int, repeats: int = 5, prefix_tokens: int = 32) -> CostTable:
    """Median wall time (ms) of a forward over n new tokens after a cached prefix, n = 1..max_tokens."""
    check(isinstance(max_tokens, int) and 1 <= max_tokens <= 256, "max_tokens", max_tokens,
          "must be an integer in [1, 256]")
    check(isinstance(repeats, int) and repeats >= 1, "repeats", repeats, "must be an integer >= 1")
    medians = [statistics.median(times) for _, times in forward_times(lm, range(1, max_tokens + 1), repeats,
                                                                      prefix_tokens)]
    return CostTable(verify_ms=tuple(non_decreasing(medians)), source="profiled", device=str(lm.device),
                     model=lm.name)


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence in squared error (pool adjacent violators): a forward over more
    tokens is not cheaper than one over fewer, so medians that say so (a busy moment of the machine) are
    pooled into their mean instead of steering a size choice."""
    blocks: list[list[float]] = []                 # [mean, count] of each pooled run
    for value in values:
        blocks.append([float(value), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_a, n_a), (mean_b, n_b) = blocks[-2], blocks.pop()
            blocks[-1] = [(mean_a * n_a + mean_b * n_b) / (n_a + n_b), n_a + n_b]
    return [mean for mean, count in blocks for _ in range(int(count))]


def probe_ids(lm, n: int) -> list[int]:
    """n fixed token ids spread over the vocabulary, for timing runs that need no tokenizer."""
    return [(7 * i + 3) % lm.vocab_size for i in range(n)]


def forward_times(lm, counts: Iterable[int], repeats: int, prefix_tokens: int = 32
                  ) -> Iterator[tuple[int, list[float]]]:
    """(n, wall times in ms of `repeats` forwards over n new tokens after a cached prefix) for each n in
    `counts`, all logits computed as a verification does. The prefix is computed once, then a warm-up
    forward; each timed forward is trimmed off the cache again afterwards."""
    from decoding.runtime.kv_rollback import roll_back  # torch, loaded when a model is profiled

    counts = list(counts)
    ids = probe_ids(lm, prefix_tokens + max(counts))
    cache = lm.sequence_cache(rollback=True)
    lm.forward(ids[:prefix_tokens], cache)
    lm.forward(ids[prefix_tokens:prefix_tokens + 1], cache)   # warm-up
    roll_back(cache, prefix_tokens)
    for n in counts:
        new = ids[prefix_tokens:prefix_tokens + n]
        times = []
        for _ in range(repeats):
            lm.sync()
            start = time.perf_counter()
            lm.forward(new, cache)
            lm.sync()
            times.append((time.perf_counter() - start) * 1000.0)
            roll_back(cache, prefix_tokens)
        yield n, times


AUTO = "auto"                       # profile on this device once, then cache (config.AUTO_COST)
AUTO_SOURCE = "auto: "              # a trace's name of the auto table: this, then its file name (no server folder)
AUTO_MIN_TOKENS = 17                # an auto table covers at least this many tokens
MAX_AUTO_TABLES = 64                # profiled tables kept in the cache; the least recently used go first


def auto_cost_path(lm) -> Path:
    """Where the auto table of this model, device, dtype, CPU GEMM plan and fast path is cached."""
    dtype = str(lm.dtype).replace("torch.", "")
    plan = getattr(lm, "gemm_plan", None)                                # other kernels, other times
    packed = f"-gemm-{plan.tag}" if getattr(lm, "packed_linears", 0) and plan is not None else ""
    if packed and "packed" in plan.kernels:
        from decoding.runtime.packed_gemm import PACK_ROWS_HINT

        packed += f"-pack{PACK_ROWS_HINT}"                              # the pack's layout sets its times too
    fast = "-fast-path" if getattr(lm, "fast", None) is not None else ""   # graphs: other step times
    return cache_dir("cost") / f"{safe_name(f'{model_key(lm.name)}-{lm.device}-{dtype}{packed}{fast}')}.json"


def load_table(lm, cost_table: str, need: int) -> CostTable:
    """The table a config names: "auto" (profiled on this device on first use and cached; profiled
    again when it covers fewer than `need` tokens) or a JSON file that must cover `need` tokens. Its
    `source`, which traces record as `cost_source`, names no folder (a trace may leave the server): AUTO_SOURCE
    and the cached file's name for "auto", a file's name alone otherwise (the config keeps the path given)."""
    if cost_table == AUTO:
        path = auto_cost_path(lm)
        cost = load_from_cache(CostTable.load, path)
        if cost is None or cost.max_tokens < need:
            cost = profile_verify_cost(lm, max(need, AUTO_MIN_TOKENS))
            save_auto(cost, path)
        else:
            touch(path)
        return dataclasses.replace(cost, source=AUTO_SOURCE + path.name,    # a table cached before the fit too
                                   verify_ms=tuple(non_decreasing(cost.verify_ms)))
    cost = CostTable.load(cost_table)
    check(cost.max_tokens >= need, "cost_table", cost_table,
          f"covers {cost.max_tokens} tokens; this run verifies up to {need}")
    return cost


def draft_token_ms(target, draft) -> tuple[float, str]:
    """(ms, where it is cached): one draft-model token (a 1-token forward after a cached prefix), profiled
    on this device on first use and cached per target and draft."""
    table_path = auto_cost_path(target)
    path = table_path.with_name(f"{table_path.stem}--draft-{safe_name(draft.name)}.json")
    table = load_from_cache(CostTable.load, path)
    if table is None:
        table = profile_verify_cost(draft, 1, repeats=15)
        save_auto(table, path)
    else:
        touch(path)
    return table.ms(1), str(path)


def save_auto(table: CostTable, path: Path) -> None:
    """Cache a profiled table; the folder keeps the MAX_AUTO_TABLES most recently used (one per model,
    device, dtype and kernel plan, and per draft model: a few hundred bytes each)."""
    if save_to_cache(table.save, path):
        keep_recent(path.parent.glob("*.json"), MAX_AUTO_TABLES)
