"""Strategy parameters and page settings, without streamlit: which fields a strategy's config has
beyond the shared ones, building a validated config from widget values, and the URL (query
parameter) form of the settings."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decoding.core.config import CONFIGS, BaseConfig
from decoding.core.errors import ConfigError
from ui.widgets.advanced import (
    COST_FIELD,
    LINK_MODEL_OPTIONS,
    MAX_COST_LINK_CHARS,
    CostPick,
    optional_fields,
    shorten,
)

SHARED_FIELDS = {f.name for f in dataclasses.fields(BaseConfig)}   # max_new_tokens, seed, top_n
EDITABLE_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class ParamField:
    name: str
    type: type        # bool | int | float | str
    default: Any


def param_fields(strategy: str) -> list[ParamField]:
    """The strategy's own parameters (beyond the shared ones) that a simple widget can edit."""
    config_cls = CONFIGS[strategy]
    hints = typing.get_type_hints(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        tp = hints.get(f.name)
        if f.name in SHARED_FIELDS or tp not in EDITABLE_TYPES or f.default is dataclasses.MISSING:
            continue
        out.append(ParamField(f.name, tp, f.default))
    return out


def build_config(strategy: str, params: Mapping[str, Any], *, seed: Any, max_new_tokens: Any,
                 top_n: Any) -> BaseConfig:
    """A validated config; raises ConfigError naming the parameter (also for an unknown strategy).
    A cost table picked in the sidebar (advanced.CostPick) becomes its config value and must cover
    the config's largest verification."""
    if strategy not in CONFIGS:
        raise ConfigError("strategy", strategy, f"choose one of {', '.join(CONFIGS)}")
    kwargs = dict(params)
    pick = kwargs.get(COST_FIELD)
    if isinstance(pick, CostPick):
        kwargs[COST_FIELD] = pick.config_value()
    config = CONFIGS[strategy](max_new_tokens=max_new_tokens, seed=seed, top_n=top_n, **kwargs)
    if isinstance(pick, CostPick):
        pick.check_covers(config)
    return config


@dataclass(frozen=True)
class Settings:
    """Everything the sidebar chose. `config` is None when a parameter is invalid (`error` says which)."""

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    prompt: str = "Explain speculative decoding in one sentence."
    chat_template: bool = True
    strategy: str = "greedy"
    params: dict = field(default_factory=dict)
    seed: int = 0
    max_new_tokens: int = 32
    top_n: int = 10
    config: BaseConfig | None = None
    error: str | None = None
    model_options: dict = field(default_factory=dict)   # gguf_file, device_map, max_memory, offload_folder, fast_path

    def model_key(self) -> tuple:
        return model_key(self.model, self.device, self.dtype, self.model_options)


def model_key(model: str, device: str, dtype: str, options: dict) -> tuple:
    """Which loaded model a page's settings stand for: (model, device, dtype), then the set model options as
    (name, value) pairs."""
    return (model, device, dtype, *sorted(options.items()))


# ------------------------------------------------------------------ URL form

QP_SCALARS = {"model": str, "device": str, "dtype": str, "prompt": str, "chat": bool, "strategy": str,
              "seed": int, "max_new": int, "top_n": int, **dict.fromkeys(LINK_MODEL_OPTIONS, str), "fast_path": bool}


def parse_value(text: str, tp: type) -> Any:
    """Parse one query-parameter string; raise ValueError when it does not fit."""
    if tp is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    return tp(text)


def to_query(settings: Settings) -> dict[str, str]:
    out = {"model": settings.model, "device": settings.device, "dtype": settings.dtype,
           "prompt": settings.prompt, "chat": "1" if settings.chat_template else "0",
           "strategy": settings.strategy, "seed": str(settings.seed),
           "max_new": str(settings.max_new_tokens), "top_n": str(settings.top_n)}
    out.update({name: "1" if value is True else value for name, value in settings.model_options.items()
                if name in LINK_MODEL_OPTIONS})
    for name, value in settings.params.items():
        text = value.link() if isinstance(value, CostPick) else value
        if text is not None:                       # None: an optional parameter that is off
            out[name] = str(text)
    return out


MAX_LINK_CHARS = MAX_COST_LINK_CHARS      # the longest value a link parameter may carry (a cost table's)


def from_query(query: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Split query parameters into (shared values, strategy params, names that did not parse).
    Unknown names are ignored; a value over MAX_LINK_CHARS counts as not parsed; strategy params are
    typed by the chosen strategy's fields; optional (Advanced) params stay text, for their widgets to read."""
    bad = sorted(name for name, value in query.items() if len(str(value)) > MAX_LINK_CHARS)
    query = {name: value for name, value in query.items() if name not in bad}
    shared, params = {}, {}
    for name, tp in QP_SCALARS.items():
        if name in query:
            try:
                shared[name] = parse_value(str(query[name]), tp)
            except ValueError:
                bad.append(name)
    strategy = shared.get("strategy")
    if strategy in CONFIGS:
        for f in param_fields(strategy):
            if f.name in query:
                try:
                    params[f.name] = parse_value(str(query[f.name]), f.type)
                except ValueError:
                    bad.append(f.name)
        params.update({f.name: str(query[f.name]) for f in optional_fields(strategy) if f.name in query})
    return shared, params, bad


# ------------------------------------------------------------------ server paths in links

LINK_PATHS = ("model", "gguf_file", "draft", "drafter")   # link values that may name a file on the server


def path_values(shared: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, str]:
    """The path parameters among a link's (or the sidebar's) shared values and strategy params, as text."""
    values = {**{k: v for k, v in shared.items() if k in LINK_PATHS}, **{k: v for k, v in params.items()
                                                                         if k in LINK_PATHS}}
    return {k: str(v).strip() for k, v in values.items()}


def current_paths(settings: Settings) -> dict[str, str]:
    return path_values({"model": settings.model, **settings.model_options}, settings.params)


def link_safe(message: str, from_link: Mapping[str, str], current: Mapping[str, str]) -> str:
    """`message`, unless it is about a path whose value a link set and the sidebar still holds: a message
    naming that parameter, or one that mentions the value anywhere (its file's name included: "... from model
    '/srv/x'", a drafter trained for it). Then one line that is the same whatever the cause, so that a link
    cannot learn whether a path exists on the server (or anything else about it). A value typed in the sidebar
    gets the full message."""
    held = {name: value for name, value in from_link.items() if current.get(name) == value}
    name = message.split("=", 1)[0]
    about = name if name in held else next((n for n, v in held.items() if _mentions(message, v)), None)
    if about is None:
        return message
    return (f"{about}={shorten(held[about])!r} from the link cannot be used on this server (a link is "
            f"not told why; a value typed in the sidebar is)")


def _mentions(message: str, value: str) -> bool:
    """Whether `message` shows a link's path `value`: whole, shortened, or the file or folder name it ends in
    (after a "kind:" or "lookup+" prefix)."""
    path = value.rsplit("+", 1)[-1].split(":", 1)[-1].rstrip("/\\")
    last = path.replace("\\", "/").rsplit("/", 1)[-1]
    return any(len(part) >= 3 and part in message for part in {value, shorten(value), path, last})
