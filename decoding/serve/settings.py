"""A request's strategy and settings: the server's, chosen at start with the command line's flags, with
the request's overrides checked by the same rules. A flag's name, type and choices come from the command
line's parser, the ranges from the strategy's config: one definition of each rule for both."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from decoding.core.config import BaseConfig
from decoding.core.errors import ConfigError, check
from decoding.runner import STRATEGIES

# A setting a request may give as text: a name ('lookup', 'feature+recycling', 'auto'), never a file or a
# model path, which only the command line at start may name.
NAME = re.compile(r"[A-Za-z0-9_+-]{1,64}")
COMMON = ("max_new_tokens", "seed", "top_n")      # every strategy's settings: kept when a request switches


@dataclass(frozen=True)
class Rules:
    """The command line's rules, handed over by decoding/__main__.py."""

    flags: Mapping[str, argparse.Action]     # the serve command's flags by name
    make_config: Callable                    # (strategy, namespace) -> the strategy's frozen config
    check_applicable: Callable               # ([strategy], namespace) -> None, or ConfigError
    strategy_kwargs: Callable                # (config, namespace, lm) -> what the strategy needs loaded


def overridable(rules: Rules) -> tuple[str, ...]:
    """The settings a request may override: the strategy, and every flag that is a strategy's setting."""
    fields = set().union(*({f.name for f in dataclasses.fields(s.config_cls)} for s in STRATEGIES.values()))
    return ("strategy", *sorted(name for name in rules.flags if name in fields))


def typed(action: argparse.Action, value, param: str):
    """`value` from a JSON body, checked against the flag's type and choices; the value the flag would hold."""
    if action.nargs == 0:                                   # a switch (--early-stopping)
        check(isinstance(value, bool), param, value, "must be true or false")
    elif action.type is int:
        check(isinstance(value, int) and not isinstance(value, bool), param, value, "must be an integer")
    elif action.type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        check(ok, param, value, "must be a finite number")
        value = float(value)
    else:
        check(isinstance(value, str) and NAME.fullmatch(value) is not None, param, value,
              "must be a name (letters, digits, '_', '+', '-'); files and model paths are given at start")
    if action.choices is not None:
        check(value in action.choices, param, value, f"choose one of {', '.join(map(str, action.choices))}")
    return value


def merged(base: argparse.Namespace, rules: Rules, overrides: Mapping[str, object]) -> argparse.Namespace:
    """The server's flags with a request's overrides (checked); a request that names another strategy
    starts from that strategy's defaults, keeping only the settings every strategy has."""
    values = dict(vars(base))
    strategy = overrides.get("strategy", base.strategy)
    if strategy != base.strategy:
        values.update({name: None for name in overridable(rules) if name not in COMMON})
    for name, value in overrides.items():
        values[name] = typed(rules.flags[name], value, name)
    return argparse.Namespace(**values)


def request_config(base: argparse.Namespace, rules: Rules, overrides: Mapping[str, object]) -> BaseConfig:
    """The frozen config of a request: as `python -m decoding run` would build it from the same flags."""
    unknown = sorted(set(overrides) - set(overridable(rules)))
    if unknown:
        raise ConfigError(f"decodescope.{unknown[0]}", overrides[unknown[0]],
                          f"is not a setting; a request may set {', '.join(overridable(rules))}")
    args = merged(base, rules, overrides)
    rules.check_applicable([args.strategy], args)
    return rules.make_config(args.strategy, args)


NEUTRAL = {"temperature": 0.0, "top_p": 1.0}   # OpenAI values that mean what greedy and beam search do anyway


def with_openai(base: argparse.Namespace, openai: Mapping[str, object], own: Mapping[str, object]) -> dict:
    """A request's overrides: its `decodescope` settings (`own`) and OpenAI's fields by their flag names
    (`openai`: max_new_tokens, temperature, top_p, seed), one value each; temperature 0 and top_p 1 are
    left out for a strategy that has no such setting (greedy, beam)."""
    for name in sorted(set(openai) & set(own)):
        raise ConfigError(f"decodescope.{name}", own[name], "is given twice: as an OpenAI field and here")
    strategy = STRATEGIES.get(own.get("strategy", base.strategy))
    fields = {f.name for f in dataclasses.fields(strategy.config_cls)} if strategy is not None else set()
    kept = {k: v for k, v in openai.items() if not (k in NEUTRAL and k not in fields and v == NEUTRAL[k])}
    return {**kept, **own}
