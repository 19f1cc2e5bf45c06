"""Per-process model cache and per-session run state for the pages."""
from __future__ import annotations

import time
from concurrent import futures

import streamlit as st

from decoding.core.errors import ConfigError
from decoding.runtime import heap, load_progress
from decoding.runtime.model_cache import ModelCache
from decoding.runtime.model_spec import ModelSpec
from ui.views import made_with
from ui.views.text import md_text
from ui.widgets import engine, keys
from ui.widgets.live import LiveRun, release_idle, release_where
from ui.widgets.params import Settings, current_paths, link_safe

# Model copies the server holds at once (docs/app.md, "On a shared server"): each key (model, device, dtype,
# model options) is a copy of its own, ~0.5 GB for the embedded model in float32; the least recently used
# goes first, whatever a link asks for. A draft is built on its target (the shallow draft shares its layers),
# so it goes with it. A dropped copy is let go by every run that holds it (let_go_of_dropped), so no tab, open
# or closed, keeps one beyond the step it is taking.
TARGET_COPIES = 2
DRAFT_COPIES = 1
LOADS = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="decodescope-load")   # loads run alone anyway
PROGRESS_AFTER_S = 0.3          # a load that takes longer shows its stage
PROGRESS_POLL_S = 0.25


def let_go_of_dropped() -> int:
    """Release every run (any session's, a closed tab's that Streamlit still keeps included) holding a model
    or draft model that the caches no longer hold, unless it is in the middle of a step; its next Step
    reloads from the cache (live.LiveRun). How many runs were released."""
    held = {id(model) for model in (*TARGETS.values(), *DRAFTS.values())}
    return release_where(lambda run: any(id(model) not in held for model in run.models()))


def dropped(_key: tuple | None = None) -> None:
    """A copy left a cache: runs let go of it, and the freed heap goes back to the OS (heap.give_back);
    without that, glibc keeps a dropped copy's pages and the server grows by about a copy per new key.
    On CUDA, PyTorch's cached blocks go back to the driver too (free_device_memory)."""
    let_go_of_dropped()
    heap.give_back()
    engine.free_device_memory()


def drop_drafts_of(key: tuple) -> None:
    """A dropped target's drafts go with it; `dropped` runs once (DRAFTS' own cue when a draft went)."""
    before = len(DRAFTS.keys())
    DRAFTS.drop(keep=lambda draft_key: draft_key[-1] != key)
    if len(DRAFTS.keys()) == before:
        dropped(key)


DRAFTS: ModelCache = ModelCache(DRAFT_COPIES, on_drop=dropped)
TARGETS: ModelCache = ModelCache(TARGET_COPIES, on_drop=drop_drafts_of)


def load_lm(name: str, device: str, dtype: str, **options):
    """One LM per (model, device, dtype, model options), shared by all sessions (its .lock guards each
    forward) while it is among the TARGET_COPIES most recently used. `options`: ModelSpec's gguf_file,
    device_map, max_memory, offload_folder, fast_path when set."""
    return TARGETS.get(target_key(name, device, dtype, options),
                       lambda: engine.load(ModelSpec(name=name, device=device, dtype=dtype, **options)))


def target_key(name: str, device: str, dtype: str, options: dict) -> tuple:
    """The TARGETS key of one model copy."""
    return (name, device, dtype, *sorted(options.items()))


def load_lm_for(model_key: tuple):
    """load_lm for a Settings.model_key(): the options go as keywords only when set, so a plain model
    has the same cache entry as load_lm(name, device, dtype)."""
    name, device, dtype, *options = model_key
    return load_lm(name, device, dtype, **dict(options))


def held_model(model_key: tuple):
    """The model of a Settings.model_key() if this process holds it, else None (nothing is loaded)."""
    name, device, dtype, *options = model_key
    return TARGETS.peek(target_key(name, device, dtype, dict(options)))


def load_showing_progress(model_key: tuple):
    """load_lm_for(model_key) on a loader thread; when it takes longer than PROGRESS_AFTER_S (a first start
    converting the embedded model, a model not yet in memory), a progress bar names the stage it is in
    (decoding.runtime.load_progress) until it ends. Its errors are the load's."""
    held = held_model(model_key)
    if held is not None:                     # the usual rerun: no thread, no wait
        return held
    future = LOADS.submit(load_lm_for, model_key)
    done, _ = futures.wait([future], timeout=PROGRESS_AFTER_S)
    if not done:
        bar = st.empty()
        while not futures.wait([future], timeout=PROGRESS_POLL_S)[0]:
            show_stage(bar, load_progress.current())
        bar.empty()
    return future.result()


def show_stage(where, now: load_progress.Current | None) -> None:
    """The load's stage as a progress bar in `where` (nothing known yet: the bar at 0)."""
    if now is None:
        where.progress(0.0, text="Loading the model…")
        return
    where.progress(now.stage.at, text=md_text(f"{now.stage.text}… {time.monotonic() - now.since:.0f} s"))


def shown(message: str, settings: Settings | None = None) -> str:
    """An error line as a page may show it: one about a server path that came from the link (and is
    still in the sidebar) says only that the value cannot be used (params.link_safe)."""
    settings = settings or st.session_state.get(keys.SETTINGS) or Settings()
    return link_safe(message, st.session_state.get(keys.QP_PATHS, {}), current_paths(settings))


def lm_or_stop(settings: Settings):
    """The settings' model, or an st.error naming what to fix and a stopped page."""
    release_idle()                  # any page asking for a model frees what idle sessions' runs hold
    if let_go_of_dropped():         # and dropped copies that runs stepping at the drop kept
        heap.give_back()
    try:
        with st.spinner(f"Loading model {md_text(repr(settings.model))}…"):
            lm = load_showing_progress(settings.model_key())
        later = st.session_state.pop(keys.DRAFTING_LATER, None)
        if later is not None:                   # the sidebar's sources caption, now that the model is here
            later(lm)
        return lm
    except ConfigError as err:
        st.error(md_text(shown(str(err), settings)))
    except (OSError, RuntimeError, ValueError) as err:
        message = f"model={settings.model!r} could not be loaded: {str(err).splitlines()[0][:200]}"
        st.error(md_text(shown(message, settings)))
    st.stop()


def load_draft_lm(name: str, device: str, dtype: str, target_key: tuple):
    """A draft model for speculative decoding, checked against the target's vocabulary and tokenizer (on the
    fast path when the target is); one of the DRAFT_COPIES most recently used."""
    fast = {"fast_path": True} if dict(target_key[3:]).get("fast_path") else {}
    return DRAFTS.get((name, device, dtype, target_key),
                      lambda: engine.load_draft(name, load_lm_for(target_key), device=device, dtype=dtype, **fast))


def strategy_kwargs(config, settings: Settings) -> dict:
    """What the strategy's decode needs besides the config: a loaded draft model for a speculative
    config whose `draft` names one ('lookup' needs nothing; 'lookup+MODEL' needs MODEL)."""
    name = getattr(config, "draft_model", None)
    if name is None:
        return {}
    return {"drafter": load_draft_lm(name, settings.device, settings.dtype, settings.model_key())}


def strategy_kwargs_or_stop(config, settings: Settings) -> dict:
    """strategy_kwargs, or an st.error naming what to fix and a stopped page."""
    name = getattr(config, "draft_model", None)
    if name is None:
        return {}
    try:
        with st.spinner(f"Loading draft model {md_text(repr(name))}…"):
            return strategy_kwargs(config, settings)
    except ConfigError as err:
        st.error(md_text(shown(str(err), settings)))
    except (OSError, RuntimeError, ValueError) as err:
        st.error(md_text(shown(f"draft={name!r} could not be loaded: {str(err).splitlines()[0][:200]}", settings)))
    st.stop()


def prompt_ids_or_stop(lm, settings: Settings) -> list[int]:
    """The prompt's token ids, or an st.error naming the parameter (an empty prompt, one longer than
    the model's context, max new tokens beyond the room left) and a stopped page."""
    try:
        ids = lm.encode(settings.prompt, chat_template=settings.chat_template)
        engine.check_inputs(lm, ids, settings.max_new_tokens)
        return ids
    except ConfigError as err:
        st.error(md_text(err))
        st.stop()


def config_or_stop(settings: Settings):
    if settings.config is None:
        st.error(f"Fix the sidebar first: {md_text(settings.error)}")
        st.stop()
    return settings.config


def described(settings: Settings, configs: dict | None = None) -> dict[str, str]:
    """The settings in words (made_with.describe): what a result keeps to say what made it. `configs`:
    label -> config; the sidebar's own strategy when not given."""
    return made_with.describe(model=settings.model, prompt=settings.prompt, chat_template=settings.chat_template,
                              seed=settings.seed, max_new_tokens=settings.max_new_tokens, top_n=settings.top_n,
                              configs={"strategy": settings.config} if configs is None else configs)


def live_run(lm, settings: Settings, prompt_ids: list[int]) -> LiveRun:
    """This session's playground run; a fresh one when the model, prompt or config changed, with a note of
    what changed when the old run had steps (keys.FLASH). A run (or branch) still holding a copy of the
    model that the cache has dropped goes on with the cache's copy."""
    signature = (settings.model_key(), tuple(prompt_ids), repr(settings.config))
    run = st.session_state.get(keys.RUN)
    if run is None or st.session_state.get(keys.RUN_SIGNATURE) != signature:
        note_fresh_run(run, settings)
        run = reset_run(lm, settings, prompt_ids)
        st.session_state[keys.RUN_SIGNATURE] = signature
        st.session_state[keys.RUN_MADE_WITH] = described(settings)
    for held in (run, st.session_state.get(keys.BRANCH)):
        if held is not None:
            held.rebind(lm, lambda: strategy_kwargs_or_stop(settings.config, settings))
    return run


def note_fresh_run(old: LiveRun | None, settings: Settings) -> None:
    """Say what happened to a run with steps that new settings replace, instead of dropping it silently."""
    made = st.session_state.get(keys.RUN_MADE_WITH)
    if old is None or not old.events or made is None:
        return
    changed = made_with.changes(made, described(settings))
    why = "; ".join(changed) if changed else "the model or its tokens changed"
    st.session_state[keys.FLASH] = ("info", f"The settings changed ({why}), so the run of {len(old.events)} step(s) "
                                            "was set aside and a fresh one starts here: press Step or Run to end.")


def reset_run(lm, settings: Settings, prompt_ids: list[int]) -> LiveRun:
    config = settings.config
    run = LiveRun(lm, prompt_ids, config, prompt_text=settings.prompt,
                  strategy_kwargs=strategy_kwargs_or_stop(config, settings),
                  reload=lambda: (load_lm_for(settings.model_key()), strategy_kwargs(config, settings)))
    st.session_state[keys.RUN] = run
    st.session_state[keys.CURSOR] = -1
    st.session_state.pop(keys.BRANCH, None)
    st.session_state.pop(keys.RUNNING, None)
    return run
