"""Which settings made a result, in words, and what changed since. Pure: plain values in, text out.

A result (the Playground's run, a comparison) keeps the description of the settings that made it; the page
compares it with the current one and says what changed, so no result is shown as current when it is not.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

SHARED = ("max_new_tokens", "seed", "top_n")     # a config's fields the sidebar sets for every strategy
# The sidebar's words for a parameter (its widget's label, lower case), which every line that names a setting
# uses: a strategy's own field is its name with spaces; the shared ones have their own.
SHARED_WORDS = {"max_new_tokens": "max new tokens", "seed": "seed", "top_n": "top-N candidates recorded"}
PROMPT_CHARS = 48


def param_words(name: str) -> str:
    """A parameter as the sidebar names it: "top_k_candidates" -> "top k candidates", "top_n" -> "top-N
    candidates recorded"."""
    return SHARED_WORDS.get(name, name.replace("_", " "))


def label(name: str) -> str:
    """The sidebar widget's label of a parameter: its words with a capital first letter."""
    words = param_words(name)
    return words[:1].upper() + words[1:]


def value_words(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def settings_words(params) -> str:
    """(name, value) pairs in the sidebar's words: "draft lookup, gamma 2, max new tokens 40"."""
    return ", ".join(f"{param_words(name)} {value_words(value)}" for name, value in params)


def short(text: str, limit: int = PROMPT_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def model_name(model: str) -> str:
    """A model as a result names it: "default", an HF id ("owner/name"), or a local path's last part (never
    the server's path)."""
    text = str(model)
    hub_id = text.count("/") <= 1 and "\\" not in text and not text.startswith((".", "/", "~"))
    return text if hub_id else text.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def config_words(config) -> str:
    """A config's strategy and the parameters it sets away from their defaults, e.g. "speculative: gamma 3,
    draft lookup" ("speculative, default parameters" when it sets none)."""
    own, fields = [], [f for f in dataclasses.fields(config) if f.name not in SHARED]
    if not fields:
        return str(config.strategy)
    for f in fields:
        value = getattr(config, f.name)
        if value is None or value == f.default:
            continue
        own.append(f"{param_words(f.name)} {value_words(value)}")
    return f"{config.strategy}: {', '.join(own)}" if own else f"{config.strategy}, default parameters"


def describe(*, model: str, prompt: str, chat_template: bool, seed: int, max_new_tokens: int, top_n: int,
              configs: Mapping[str, object] = ()) -> dict[str, str]:
    """The settings of a result, name -> value in words (insertion order is the order shown).
    `configs`: label -> config (the Playground's one strategy, or Compare's lanes)."""
    out = {"model": model_name(model), "prompt": repr(short(prompt)), "chat template": "on" if chat_template else "off",
           param_words("seed"): str(seed), param_words("max_new_tokens"): str(max_new_tokens),
           param_words("top_n"): str(top_n)}
    for label, config in dict(configs).items():
        out[str(label)] = config_words(config) if config is not None else "—"
    return out


def measured_with(*, model: str, device: str, dtype: str, prompt: str | None = None,
                  chat_template: bool | None = None, settings: Mapping[str, object] = ()) -> dict[str, str]:
    """The settings of a Lab measurement in words: the model and where it ran, the prompt when the
    measurement reads one, then the section's own `settings` (its widgets' labels -> values)."""
    out = {"model": model_name(model), "device": str(device), "dtype": str(dtype)}
    if prompt is not None:
        out["prompt"] = repr(short(prompt))
        out["chat template"] = "on" if chat_template else "off"
    out.update({str(name): value_words(value) for name, value in dict(settings).items()})
    return out


def changes(made: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What differs between the settings that made a result and the current ones, one phrase each."""
    out = []
    for name in dict.fromkeys([*made, *now]):
        before, after = made.get(name), now.get(name)
        if before == after:
            continue
        if before is None:
            out.append(f"{name} added ({after})")
        elif after is None:
            out.append(f"{name} removed (was {before})")
        else:
            out.append(f"{name} {before} → {after}")
    return out


def line(made: Mapping[str, str], keys: tuple[str, ...] | None = None) -> str:
    """The settings in one line ("max new tokens 6 · seed 0 · …"); `keys` picks and orders them."""
    names = keys if keys is not None else tuple(made)
    return " · ".join(f"{name} {made[name]}" for name in names if name in made)


def stale_line(made: Mapping[str, str], now: Mapping[str, str], what: str = "This result",
               again: str = "run again") -> str | None:
    """The out-of-date note for a result, None while the settings are those that made it."""
    changed = changes(made, now)
    if not changed:
        return None
    return (f"{what} was made with other settings — the settings have changed since ({'; '.join(changed)}); "
            f"{again}.")
