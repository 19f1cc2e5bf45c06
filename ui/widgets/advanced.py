"""Optional engine parameters for the sidebar's "Advanced" expanders, without streamlit: the config
fields that are off when None (their text form: empty = off), DSpark's cost table picked as none /
auto / an uploaded JSON file (and its URL form), and the model's placement options."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoding.core.config import AUTO_COST, CONFIGS
from decoding.core.errors import ConfigError, check
from decoding.runtime.cost_table import MAX_COST_BYTES, MAX_COST_ENTRIES, CostTable
from decoding.runtime.files import keep_recent, save_to_cache, touch
from decoding.runtime.model_spec import DEVICE_MAPS
from decoding.runtime.paths import cache_dir

COST_FIELD = "cost_table"              # a file, not a text field: its own widget (none / auto / upload)
OPTIONAL_TYPES = (int, float, str)
MAX_COST_LINK_CHARS = 32 * MAX_COST_ENTRIES   # a link's table longer than this is refused before parsing
MAX_STORED_COSTS = 32                 # uploaded / linked tables kept in the cache; the least recent go first
UPLOADS_FALLBACK = "decodescope-cost-uploads"   # under the temporary folder when the cache is unwritable
MAX_SHOWN = 60                        # characters of a bad link value quoted in a message


@dataclass(frozen=True)
class OptionalField:
    name: str
    type: type         # the type when set: int | float | str


def optional_fields(strategy: str) -> list[OptionalField]:
    """The strategy's config fields typed `X | None` with a default (None: off), e.g. DSpark's
    cost_table and lossy_threshold. These are what the Advanced expander edits."""
    config_cls = CONFIGS[strategy]
    hints = typing.get_type_hints(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        args = typing.get_args(hints.get(f.name)) if isinstance(hints.get(f.name), types.UnionType) else ()
        inner = [a for a in args if a is not type(None)]
        off_by_default = f.default is None or f.name == COST_FIELD      # the cost table has its own widget
        if type(None) in args and len(inner) == 1 and inner[0] in OPTIONAL_TYPES and off_by_default:
            out.append(OptionalField(f.name, inner[0]))
    return out


def default_cost_mode(strategy: str) -> str:
    """The cost-table mode a strategy's config starts in: 'auto' for DSpark, 'none' where the default is None."""
    field = next(f for f in dataclasses.fields(CONFIGS[strategy]) if f.name == COST_FIELD)
    return "none" if field.default is None else link_mode(field.default)


def optional_value(text: Any, tp: type) -> Any:
    """The config value of an optional field's text: None when empty, the parsed value when it parses,
    else the text itself (the config then refuses it, naming the parameter and the value)."""
    if text is None or str(text).strip() == "":
        return None
    try:
        return tp(str(text).strip())
    except ValueError:
        return str(text)


def shorten(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


# ------------------------------------------------------------------ DSpark's cost table

COST_MODES = ("none", "auto", "file")
COST_LABELS = {"none": "none (fixed length)", "auto": "auto (profile on first use)",
               "file": "file (upload a JSON cost table)"}
LINK_HINT = ("give 'auto', 'none' or the verify milliseconds per token count, comma-separated (e.g. 5.1,9.8,14.2), "
             "optionally ';' and the round overhead in ms (e.g. 5.1,9.8,14.2;3.5)")


def cost_from_json(data: bytes, name: str) -> CostTable:
    """An uploaded cost table (the JSON of decoding.runtime.cost_table: version 1, verify_ms from 1 token)."""
    check(len(data) <= MAX_COST_BYTES, "cost_table", name, f"is over {MAX_COST_BYTES} bytes")
    return CostTable.parse(data, name)


def cost_to_link(table: CostTable) -> str:
    """The table in a URL: its milliseconds, exact (shortest round-trip float form), then ';' and the
    round overhead when it has one."""
    text = ",".join(repr(float(v)) for v in table.verify_ms)
    return text + (f";{table.overhead_ms!r}" if table.overhead_ms else "")


def cost_from_link(text: str) -> CostTable:
    check(len(text) <= MAX_COST_LINK_CHARS, "cost_table", shorten(text),
          f"is {len(text)} characters long, over the {MAX_COST_LINK_CHARS} a link's table may have")
    ms, separator, overhead = text.partition(";")
    try:
        values = tuple(float(v) for v in ms.split(","))
        overhead_ms = float(overhead) if separator else 0.0
    except ValueError:
        raise ConfigError("cost_table", shorten(text), LINK_HINT) from None
    try:
        return CostTable(verify_ms=values, source="link", overhead_ms=overhead_ms)
    except ConfigError as err:
        raise ConfigError("cost_table", shorten(text), err.expected) from None


def link_mode(text: str) -> str:
    """The cost-table mode a link value asks for: none, auto, or file (a table in the link)."""
    return text if text in ("none", AUTO_COST) else "file"


def store_cost(table: CostTable, name: str) -> str:
    """Save a table (one file per content and name) for the config to point at: under the cache, or, when
    the cache cannot be written, under the system's temporary folder (save_to_cache warns once); a
    ConfigError when neither can be written."""
    digest = hashlib.sha256(cost_to_link(table).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name).strip("._")[:60] or "cost"
    safe = safe if safe.endswith(".json") else safe + ".json"
    for root in (cache_dir("cost/uploads"), Path(tempfile.gettempdir()) / UPLOADS_FALLBACK):
        path = root / digest / safe
        if path.is_file():
            touch(path.parent)                 # recently used: the last to be pruned
            return str(path)
        if save_to_cache(dataclasses.replace(table, source=name).save, path):
            prune_stored(root)
            return str(path)
    raise ConfigError("cost_table", name, "could not be stored: neither the cache folder nor the temporary "
                                          "folder can be written (set DECODESCOPE_CACHE to a writable folder)")


def prune_stored(root: Path) -> None:
    """Keep the MAX_STORED_COSTS most recently used tables under `root` (one directory each)."""
    keep_recent((d for d in root.iterdir() if d.is_dir()), MAX_STORED_COSTS)


@dataclass(frozen=True)
class CostPick:
    """The cost table chosen in the sidebar. `error` is why a file pick cannot be used."""

    mode: str = "none"                 # none | auto | file
    table: CostTable | None = None     # mode file: the table uploaded or read from the link
    name: str = ""                     # its file name ("link" when read from the URL)
    path: str | None = None            # where it was stored for the config
    error: str | None = None

    def config_value(self) -> str | None:
        """The config's cost_table: None, 'auto' or the stored file; raises the pick's error."""
        if self.error is not None:
            raise ConfigError.from_line(self.error)
        return {"none": None, "auto": AUTO_COST}.get(self.mode, self.path)

    def check_covers(self, config) -> None:
        """A file's table must cover the largest verification of the config (as the engine requires)."""
        if self.table is not None:
            need = config.cost_need()
            check(self.table.max_tokens >= need, "cost_table", self.name,
                  f"covers {self.table.max_tokens} tokens; this run verifies up to {need}")

    def link(self) -> str | None:
        """The URL form: 'none', 'auto', or the table's milliseconds."""
        if self.mode in ("none", "auto"):
            return self.mode
        return cost_to_link(self.table) if self.table is not None else None


def pick_cost(mode: str, upload: tuple[str, bytes] | None, link_text: str | None) -> CostPick:
    """The pick for a mode: for 'file', the uploaded file (name, bytes), else the table in the link."""
    if mode != "file":
        return CostPick(mode=mode)
    try:
        if upload is not None:
            name, table = upload[0], cost_from_json(upload[1], upload[0])
        elif link_text:
            name, table = "link", cost_from_link(link_text)
        else:
            raise ConfigError("cost_table", None, "upload a JSON cost table (version 1 with verify_ms), "
                                                  "or choose none or auto")
        path = store_cost(table, name)
    except ConfigError as err:
        return CostPick(mode=mode, error=str(err))
    return CostPick(mode=mode, table=table, name=name, path=path)


# ------------------------------------------------------------------ model placement

MODEL_OPTIONS = ("gguf_file", "device_map", "max_memory", "offload_folder", "fast_path")
LINK_MODEL_OPTIONS = ("gguf_file", "device_map", "max_memory", "fast_path")   # offload_folder: typed only, see README
NO_DEVICE_MAP = "none"
DEVICE_MAP_CHOICES = (NO_DEVICE_MAP, *DEVICE_MAPS)


def model_options(**values: Any) -> dict[str, str | bool]:
    """The options that are set (non-empty text; device_map other than 'none'; fast_path when true), for
    ModelSpec."""
    out: dict[str, str | bool] = {}
    for name in MODEL_OPTIONS:
        value = values.get(name)
        if isinstance(value, bool):
            if value:
                out[name] = True
            continue
        if value is None or str(value).strip() in ("", NO_DEVICE_MAP):
            continue
        out[name] = str(value).strip()
    return out


def device_map_link_error(value: str) -> str | None:
    """The message for a link's device_map that is none of the choices (None when it is one)."""
    if value in DEVICE_MAP_CHOICES:
        return None
    return str(ConfigError("device_map", shorten(value), f"choose one of {', '.join(DEVICE_MAPS)} (or none)"))
