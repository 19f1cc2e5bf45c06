"""The shared sidebar: model, prompt, strategy and its parameters, seed. Settings live in the URL's
query parameters so a link reproduces a demo."""
from __future__ import annotations

import os

import streamlit as st

from decoding.core.config import CONFIGS, DSPARK_SELECT, GAMMA_POLICIES
from decoding.core.errors import ConfigError
from decoding.runtime.model_spec import DEVICES, DTYPES, ModelSpec
from ui.views import made_with
from ui.views.sources import drafting_text
from ui.views.text import md_text
from ui.widgets import display, engine, keys
from ui.widgets.advanced import (
    COST_FIELD,
    COST_LABELS,
    COST_MODES,
    DEVICE_MAP_CHOICES,
    NO_DEVICE_MAP,
    CostPick,
    OptionalField,
    default_cost_mode,
    device_map_link_error,
    link_mode,
    model_options,
    optional_fields,
    optional_value,
    pick_cost,
)
from ui.widgets.params import (
    ParamField,
    Settings,
    build_config,
    from_query,
    link_safe,
    model_key,
    param_fields,
    path_values,
    to_query,
)
from ui.widgets.session import held_model

MODEL_ENV = "DECODESCOPE_MODEL"
QP_WIDGETS = {"model": keys.MODEL, "device": keys.DEVICE, "dtype": keys.DTYPE, "prompt": keys.PROMPT,
              "chat": keys.CHAT, "strategy": keys.STRATEGY, "seed": keys.SEED, "max_new": keys.MAX_NEW,
              "top_n": keys.TOP_N, "gguf_file": keys.GGUF_FILE, "device_map": keys.DEVICE_MAP,
              "max_memory": keys.MAX_MEMORY, "fast_path": keys.FAST_PATH}
OPTION_HELP = {
    "lossy_threshold": "LOSSY mode: accept a drafted token outright when p target exceeds this, in (0, 1]; "
                       "changes the output distribution; needs temperature > 0. Empty: exact.",
    COST_FIELD: "Pick the draft length (or tree budget) per round that maximizes expected tokens per ms of "
                "the round (speculative: used by gamma policy 'cost', where none means auto). "
                "none: fixed length; auto: profile this model on this device at the first "
                "step and cache the table (DSpark: plus its round overhead, timed once per drafter in this "
                "process); file: a JSON table {\"version\": 1, \"verify_ms\": [...], \"overhead_ms\": ...} "
                "(ms of one target forward over 1, 2, ... tokens; DSpark's round cost outside it, optional), "
                "the format decoding/runtime/cost_table.py saves.",
}
PARAM_HELP = {   # (strategy, field) -> the widget's tooltip
    ("dspark", "lookup_max_ngram"): "Prompt-lookup candidates: add the tokens that followed an earlier occurrence of "
                                    "the context's last n-gram (n up to this) as one more candidate per position, "
                                    "scored by how often lookup's tokens matched the output so far. 0: off. "
                                    "Helps when the answer copies from the prompt; stays exact.",
    ("dspark", "drafter"): "auto (the default): the shipped feature drafter on the model it was trained for, token "
                           "recycling on any other. feature: the trained feature drafter as a sequential head; "
                           "each position's candidates come from the two likeliest candidates before it. parallel: "
                           "the trained parallel drafter, every position from one pass over the target's states "
                           "(feature:FILE, parallel:FILE for other weights). recycling: the target's own earlier "
                           "next-token guesses per token; suffix: what followed the context's last words in earlier "
                           "text; model:ID a draft model with the target's vocabulary. Join with + to compose: "
                           "feature+recycling.",
    ("speculative", "lookup_max_ngram"): "Prompt lookup (draft 'lookup' or 'lookup+…'): the longest n-gram matched.",
    ("speculative", "gamma_policy"): "fixed: γ every round. heuristic: +2 after a fully accepted round, −1 "
                                     "otherwise. confidence: stop drafting below the confidence threshold. "
                                     "cost: per round the γ ≤ gamma with the fewest ms per expected token, from "
                                     "the verify-cost table (Advanced; none = auto) and this run's acceptance.",
    ("speculative", "draft"): "lookup: prompt lookup (copies from the context). recycling: the target's own earlier "
                              "next-token guesses per token, for any model. auto: lookup+feature on the model the "
                              "shipped feature drafter fits, lookup+recycling elsewhere. shallow: the trained "
                              "self-draft (shallow:FILE for other weights). feature: the trained feature drafter, "
                              "which drafts from the target's own last LM-head input (feature:FILE for other "
                              "weights). model:ID (or the bare id or path): a draft model with the target's "
                              "vocabulary. "
                              "suffix: matches of the context's end in earlier text. lookup+MODEL: "
                              "prompt lookup where the context has an n-gram match of 2 or "
                              "more tokens (1 when lookup max ngram is 1), MODEL in the other rounds.",
}
PARAM_CHOICES = {("speculative", "gamma_policy"): GAMMA_POLICIES, ("dspark", "select"): DSPARK_SELECT}
PAGE_QUERY_PARAMS = (keys.QP_TOUR_STOP, keys.QP_STEP)   # owned by a page; kept when the settings rewrite the URL


def default_model() -> str:
    return os.environ.get(MODEL_ENV, "").strip() or "default"


def _load_query_params_once() -> None:
    """On a session's first run, copy the URL's settings into the widgets."""
    if st.session_state.get(keys.QP_LOADED):
        return
    st.session_state[keys.QP_LOADED] = True
    shared, params, bad = from_query(st.query_params.to_dict())
    st.session_state[keys.QP_PATHS] = path_values(shared, params)
    link_errors = []
    for name, value in shared.items():
        choices = {"device": DEVICES, "dtype": DTYPES, "strategy": CONFIGS}.get(name)
        if choices is not None and value not in choices:
            bad.append(name)
            continue
        if name == "device_map" and device_map_link_error(value):
            link_errors.append(device_map_link_error(value))
            continue
        st.session_state[QP_WIDGETS[name]] = value
    strategy = shared.get("strategy")
    for name, value in params.items():
        key = keys.param_key("w", strategy, name)
        options = PARAM_CHOICES.get((strategy, name))
        if options and value not in options:
            link_errors.append(str(ConfigError(name, value, f"choose one of {', '.join(options)}")))
        elif name == COST_FIELD:
            st.session_state[key] = link_mode(value)
            if link_mode(value) == "file":
                st.session_state[keys.cost_link_key(key)] = value
        else:
            st.session_state[key] = value
    if bad:
        st.session_state[keys.QP_BAD] = bad
    if link_errors:
        st.session_state[keys.QP_LINK_ERRORS] = link_errors


def _key(key: str, default):
    """Widgets take their defaults from session state (so URL values can be put there first)."""
    st.session_state.setdefault(key, default)
    return key


def param_widget(scope: str, strategy: str, f: ParamField):
    key = _key(keys.param_key(scope, strategy, f.name), float(f.default) if f.type is float else f.default)
    label, tip = md_text(made_with.param_words(f.name)), PARAM_HELP.get((strategy, f.name))
    options = PARAM_CHOICES.get((strategy, f.name))
    if options:                                  # a link's value outside them was refused on loading
        return st.selectbox(label, options, key=key, help=tip)
    if f.type is bool:
        return st.checkbox(label, key=key, help=tip)
    if f.type is int:
        return st.number_input(label, step=1, key=key, help=tip)
    if f.type is float:
        return st.number_input(label, step=0.05, format="%.3f", key=key, help=tip)
    return st.text_input(label, key=key, help=tip)


def optional_widget(scope: str, strategy: str, f: OptionalField):
    """A text field for an optional parameter: empty is off (None)."""
    key = _key(keys.param_key(scope, strategy, f.name), "")
    text = st.text_input(f"{md_text(made_with.param_words(f.name))} (empty: off)", key=key,
                         help=OPTION_HELP.get(f.name))
    return optional_value(text, f.type)


def cost_widget(scope: str, strategy: str) -> CostPick:
    """DSpark's cost table: none, auto (profiled on first use) or an uploaded JSON file (or the table a
    link gave, until a file is uploaded)."""
    key = _key(keys.param_key(scope, strategy, COST_FIELD), default_cost_mode(strategy))
    mode = st.radio("cost table", COST_MODES, format_func=COST_LABELS.get, key=key, help=OPTION_HELP[COST_FIELD])
    upload = None
    if mode == "file":
        file = st.file_uploader("cost table JSON", type=["json"], key=keys.cost_file_key(key))
        upload = (file.name, file.getvalue()) if file is not None else None
    pick = pick_cost(mode, upload, st.session_state.get(keys.cost_link_key(key)))
    if pick.table is not None:
        ms = pick.table.verify_ms
        st.caption(f"{md_text(pick.name)}: {len(ms)} entries, {ms[0]:.3g} ms for 1 token … {ms[-1]:.3g} ms for "
                   f"{len(ms)}")
    return pick


def strategy_params(scope: str, strategy: str, model_key: tuple | None = None) -> dict:
    """Widgets for the strategy's own parameters (one per config field), the optional ones in an
    "Advanced" expander; returns their values (a cost table as an advanced.CostPick). Given the model's
    key, the draft (drafter) field has a caption under it: what it resolves to on that model."""
    params, slot = {}, None
    for f in param_fields(strategy):
        params[f.name] = param_widget(scope, strategy, f)
        if f.name == DRAFT_FIELDS.get(strategy) and model_key is not None:
            slot = st.empty()
    optional = optional_fields(strategy)
    if optional:
        with st.expander("Advanced"):
            for f in optional:
                params[f.name] = cost_widget(scope, strategy) if f.name == COST_FIELD else \
                    optional_widget(scope, strategy, f)
    if slot is not None:
        drafting_caption(slot, strategy, params, model_key)
    return params


DRAFT_FIELDS = {"speculative": "draft", "dspark": "drafter"}   # the field whose "auto" resolves by the model
NOT_LOADED = "Sources: shown once the model is loaded ('auto' chooses by the model)."


def drafting_caption(slot, strategy: str, params: dict, model_key: tuple) -> None:
    """Which sources a run of these settings will use on the model and why, in the words of the step
    panel (sources.drafting_text), from the model in memory; nothing is loaded or run for it. A model not
    yet in memory: a placeholder, filled if the page loads the model in this run (session.lm_or_stop)."""
    lm = held_model(model_key)
    if lm is None:
        slot.caption(NOT_LOADED)
        st.session_state[keys.DRAFTING_LATER] = lambda loaded: _drafting_line(slot, strategy, params, loaded)
    else:
        _drafting_line(slot, strategy, params, lm)


def _drafting_line(slot, strategy: str, params: dict, lm) -> None:
    """The caption on `lm`; settings that do not make a config have their error line below instead."""
    try:
        info = engine.planned_drafting(lm, build_config(strategy, params, seed=0, max_new_tokens=1, top_n=1))
    except ConfigError:
        slot.empty()
        return
    slot.caption(md_text(drafting_text(info, speculative=strategy == "speculative")))


def model_option_widgets() -> dict[str, str]:
    """The model's GGUF file, accelerate placement (device_map, max_memory, offload_folder) and fast path."""
    with st.expander("Advanced model options"):
        gguf_file = st.text_input("GGUF file (inside the model directory)", key=_key(keys.GGUF_FILE, ""))
        device_map = st.selectbox("device map (accelerate)", DEVICE_MAP_CHOICES,
                                  key=_key(keys.DEVICE_MAP, NO_DEVICE_MAP),
                                  help="Place a model too large for one device: GPUs, then CPU, then disk. "
                                       "Leave Device at auto.")
        max_memory = st.text_input("max memory (with a device map)", key=_key(keys.MAX_MEMORY, ""),
                                   placeholder="0=20GiB,cpu=64GiB", help="Per-device budget; the rest goes to disk.")
        offload_folder = st.text_input("offload folder (with a device map)", key=_key(keys.OFFLOAD_FOLDER, ""),
                                       help="Where weights offloaded to disk go (default: the cache). "
                                            "Not kept in the link.")
        fast_path = st.checkbox("fast path (CUDA graphs)", key=_key(keys.FAST_PATH, False),
                                help="On one CUDA GPU: decode on static KV caches and replay each step as a "
                                     "CUDA graph (one launch instead of hundreds; same tokens). Not on the CPU.")
        if engine.ENGINE.threads is not None:
            st.caption(f"CPU threads for the model: {engine.ENGINE.threads:d} (one core is left to this server and the "
                       "browser, unless OMP_NUM_THREADS is set; the command line takes them all).")
    return model_options(gguf_file=gguf_file, device_map=device_map, max_memory=max_memory,
                         offload_folder=offload_folder, fast_path=fast_path)


def _validate(model: str, device: str, dtype: str, options: dict, build) -> tuple[object, list[str]]:
    """Validate the model options, then build the config; (config or None, one-line messages)."""
    messages = []
    try:
        ModelSpec(name=model, device=device, dtype=dtype, **options)
    except ConfigError as err:
        messages.append(str(err))
    config = None
    try:
        config = build()
    except ConfigError as err:
        messages.append(str(err))
    return (None if messages else config), messages


def render() -> Settings:
    _load_query_params_once()
    st.session_state.pop(keys.DRAFTING_LATER, None)
    sb = st.sidebar
    with sb:
        st.header("DecodeScope")
        if st.session_state.get(keys.QP_BAD):
            st.warning(f"Ignored unreadable link parameter(s): {md_text(', '.join(st.session_state[keys.QP_BAD]))}")
        for message in st.session_state.get(keys.QP_LINK_ERRORS, ()):
            st.error(f"{md_text(message)} (ignored)")
        model = st.text_input("Model", key=_key(keys.MODEL, default_model()),
                              help="'default' (embedded SmolLM2-135M-Instruct), a local path or an HF id")
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", DEVICES, key=keys.DEVICE)
        dtype = c2.selectbox("Dtype", list(DTYPES), key=keys.DTYPE)
        options = model_option_widgets()
        prompt = st.text_area("Prompt", key=_key(keys.PROMPT, Settings.prompt), height=90)
        chat = st.checkbox("Use the chat template", key=_key(keys.CHAT, True))
        strategy = st.selectbox("Strategy", list(CONFIGS), key=_key(keys.STRATEGY, "greedy"))
        model = model.strip() or "default"
        params = strategy_params("w", strategy, model_key(model, device, dtype, options))
        c3, c4 = st.columns(2)
        seed = c3.number_input(made_with.label("seed"), step=1, key=_key(keys.SEED, 0))
        max_new = c4.number_input(made_with.label("max_new_tokens"), step=1,
                                  key=_key(keys.MAX_NEW, Settings.max_new_tokens))
        top_n = st.number_input(made_with.label("top_n"), step=1, key=_key(keys.TOP_N, Settings.top_n))
        config, messages = _validate(model, device, dtype, options, lambda: build_config(
            strategy, params, seed=seed, max_new_tokens=max_new, top_n=top_n))
        current = path_values({"model": model, **options}, params)
        messages = [link_safe(m, st.session_state.get(keys.QP_PATHS, {}), current) for m in messages]
        for message in messages:
            st.error(md_text(message))
        display.glossary_expander()
    settings = Settings(model=model, device=device, dtype=dtype, prompt=prompt, chat_template=chat,
                        strategy=strategy, params=params, seed=seed, max_new_tokens=max_new, top_n=top_n,
                        config=config, error=messages[0] if messages else None, model_options=options)
    kept = {name: st.query_params[name] for name in PAGE_QUERY_PARAMS if name in st.query_params}
    st.query_params.from_dict({**to_query(settings), **kept})
    return settings


def current() -> Settings:
    return st.session_state.get(keys.SETTINGS) or Settings()
