"""Per-process model cache and per-session run state for the pages."""
from __future__ import annotations

import streamlit as st

from decoding.errors import ConfigError
from decoding.models import ModelSpec, load
from ui import keys
from ui.live import LiveRun
from ui.params import Settings


@st.cache_resource(show_spinner=False, max_entries=2)
def load_lm(name: str, device: str, dtype: str):
    """One LM per (model, device, dtype), shared by all sessions (its .lock guards each forward)."""
    return load(ModelSpec(name=name, device=device, dtype=dtype))


def lm_or_stop(settings: Settings):
    """The settings' model, or an st.error naming what to fix and a stopped page."""
    try:
        with st.spinner(f"Loading model {settings.model!r}…"):
            return load_lm(*settings.model_key())
    except ConfigError as err:
        st.error(str(err))
    except (OSError, RuntimeError, ValueError) as err:
        st.error(f"model={settings.model!r} could not be loaded: {str(err).splitlines()[0][:200]}")
    st.stop()


def prompt_ids_or_stop(lm, settings: Settings) -> list[int]:
    try:
        return lm.encode(settings.prompt, chat_template=settings.chat_template)
    except ConfigError as err:
        st.error(str(err))
        st.stop()


def config_or_stop(settings: Settings):
    if settings.config is None:
        st.error(f"Fix the sidebar first: {settings.error}")
        st.stop()
    return settings.config


def live_run(lm, settings: Settings, prompt_ids: list[int]) -> LiveRun:
    """This session's playground run; a fresh one when the model, prompt or config changed."""
    signature = (settings.model_key(), tuple(prompt_ids), repr(settings.config))
    run = st.session_state.get(keys.RUN)
    if run is None or st.session_state.get(keys.RUN_SIGNATURE) != signature:
        run = reset_run(lm, settings, prompt_ids)
        st.session_state[keys.RUN_SIGNATURE] = signature
    return run


def reset_run(lm, settings: Settings, prompt_ids: list[int]) -> LiveRun:
    run = LiveRun(lm, prompt_ids, settings.config, prompt_text=settings.prompt)
    st.session_state[keys.RUN] = run
    st.session_state[keys.CURSOR] = -1
    st.session_state.pop(keys.BRANCH, None)
    st.session_state.pop(keys.RUNNING, None)
    return run
