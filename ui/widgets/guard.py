"""The last line of defence of every page: an error no check caught becomes one line on the page (no
traceback, no server path: the details go to the server's log), and what an upload put in the session
is set aside (the uploaders get new keys, dropping their files) before the page is run once more, so
that an uploaded file that breaks a page does not break it again at every rerun."""
from __future__ import annotations

import logging

import streamlit as st

from ui.views.text import md_text
from ui.widgets import keys

log = logging.getLogger("decodescope.app")

UPLOADED = (keys.REPLAY, keys.REPLAY_CURSOR, keys.WHATIF_TRACE)   # session values read from an uploaded file
GENERATION = "ds.upload_generation"      # bumped to give the uploaders new keys
NOTE = "ds.page_error"                   # the line to show on the run after a failure
RETRIED = "ds.page_retried"              # the page failed and was run once more


def uploader_key(base: str) -> str:
    """A file uploader's key: a new one after recover(), which drops the file it held."""
    generation = st.session_state.get(GENERATION, 0)
    return base if generation == 0 else f"{base}.{generation}"


def show_note() -> None:
    """Before the page: the line of a failure that the previous run recovered from."""
    if NOTE in st.session_state:
        st.error(md_text(st.session_state[NOTE]))


def page_done() -> None:
    """After a page ran through: the note has been seen."""
    st.session_state.pop(NOTE, None)
    st.session_state.pop(RETRIED, None)


def recover(err: Exception) -> None:
    """Log `err` with its traceback on the server; drop the uploaded state and run the page once more
    with the one-line note above it (if that run fails too, the note stays and the page stops there)."""
    log.error("a page failed", exc_info=err)
    for key in UPLOADED:
        st.session_state.pop(key, None)
    if st.session_state.pop(RETRIED, False):
        return                                            # this run already shows the note
    st.session_state[GENERATION] = st.session_state.get(GENERATION, 0) + 1
    st.session_state[NOTE] = (f"This page could not be shown ({type(err).__name__}); the details went to the "
                              "server's log. Any uploaded trace was set aside: upload another, or go on in the "
                              "sidebar.")
    st.session_state[RETRIED] = True
    st.rerun()
