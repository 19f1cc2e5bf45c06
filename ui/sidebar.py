"""The shared sidebar: model, prompt, strategy and its parameters, seed. Settings live in the URL's
query parameters so a link reproduces a demo."""
from __future__ import annotations

import os

import streamlit as st

from decoding.errors import ConfigError
from decoding.models import DEVICES, DTYPES
from decoding.runner import STRATEGIES
from ui import keys
from ui.params import ParamField, Settings, build_config, from_query, param_fields, to_query

MODEL_ENV = "DECODESCOPE_MODEL"
QP_WIDGETS = {"model": keys.MODEL, "device": keys.DEVICE, "dtype": keys.DTYPE, "prompt": keys.PROMPT,
              "chat": keys.CHAT, "strategy": keys.STRATEGY, "seed": keys.SEED, "max_new": keys.MAX_NEW,
              "top_n": keys.TOP_N}
PAGE_QUERY_PARAMS = (keys.QP_TOUR_STOP,)   # owned by a page; kept when the settings rewrite the URL


def default_model() -> str:
    return os.environ.get(MODEL_ENV, "").strip() or "default"


def _load_query_params_once() -> None:
    """On a session's first run, copy the URL's settings into the widgets."""
    if st.session_state.get(keys.QP_LOADED):
        return
    st.session_state[keys.QP_LOADED] = True
    shared, params, bad = from_query(st.query_params.to_dict())
    for name, value in shared.items():
        choices = {"device": DEVICES, "dtype": DTYPES, "strategy": STRATEGIES}.get(name)
        if choices is not None and value not in choices:
            bad.append(name)
            continue
        st.session_state[QP_WIDGETS[name]] = value
    strategy = shared.get("strategy")
    for name, value in params.items():
        st.session_state[keys.param_key("w", strategy, name)] = value
    if bad:
        st.session_state[keys.QP_BAD] = bad


def _key(key: str, default):
    """Widgets take their defaults from session state (so URL values can be put there first)."""
    st.session_state.setdefault(key, default)
    return key


def param_widget(scope: str, strategy: str, f: ParamField):
    key = _key(keys.param_key(scope, strategy, f.name), float(f.default) if f.type is float else f.default)
    label = f.name.replace("_", " ")
    if f.type is bool:
        return st.checkbox(label, key=key)
    if f.type is int:
        return st.number_input(label, step=1, key=key)
    if f.type is float:
        return st.number_input(label, step=0.05, format="%.3f", key=key)
    return st.text_input(label, key=key)


def strategy_params(scope: str, strategy: str) -> dict:
    """Widgets for the strategy's own parameters (one per config field); returns their values."""
    return {f.name: param_widget(scope, strategy, f) for f in param_fields(strategy)}


def render() -> Settings:
    _load_query_params_once()
    sb = st.sidebar
    with sb:
        st.header("DecodeScope")
        if st.session_state.get(keys.QP_BAD):
            st.warning(f"Ignored unreadable link parameter(s): {', '.join(st.session_state[keys.QP_BAD])}")
        model = st.text_input("Model", key=_key(keys.MODEL, default_model()),
                              help="'default' (embedded SmolLM2-135M-Instruct), a local path or an HF id")
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", DEVICES, key=keys.DEVICE)
        dtype = c2.selectbox("Dtype", list(DTYPES), key=keys.DTYPE)
        prompt = st.text_area("Prompt", key=_key(keys.PROMPT, Settings.prompt), height=90)
        chat = st.checkbox("Use the chat template", key=_key(keys.CHAT, True))
        strategy = st.selectbox("Strategy", list(STRATEGIES), key=_key(keys.STRATEGY, "greedy"))
        params = strategy_params("w", strategy)
        c3, c4 = st.columns(2)
        seed = c3.number_input("Seed", step=1, key=_key(keys.SEED, 0))
        max_new = c4.number_input("Max new tokens", step=1, key=_key(keys.MAX_NEW, Settings.max_new_tokens))
        top_n = st.number_input("Top-N candidates recorded", step=1, key=_key(keys.TOP_N, Settings.top_n))
        config, error = None, None
        try:
            config = build_config(strategy, params, seed=seed, max_new_tokens=max_new, top_n=top_n)
        except ConfigError as err:
            error = str(err)
            st.error(error)
    settings = Settings(model=model.strip() or "default", device=device, dtype=dtype, prompt=prompt,
                        chat_template=chat, strategy=strategy, params=params, seed=seed,
                        max_new_tokens=max_new, top_n=top_n, config=config, error=error)
    kept = {name: st.query_params[name] for name in PAGE_QUERY_PARAMS if name in st.query_params}
    st.query_params.from_dict({**to_query(settings), **kept})
    return settings


def current() -> Settings:
    return st.session_state.get(keys.SETTINGS) or Settings()
