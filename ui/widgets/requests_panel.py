"""The Requests page's widgets: where the request log comes from (a running `python -m decoding serve`, read
through its read-only /v1/decodescope/requests, or the log's files uploaded), the percentile table, the
histograms, the requests table, and opening one request's trace on the Traces page (the replay path that
page already has: its trace goes into keys.REPLAY)."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

import streamlit as st

from decoding.core.trace import TraceFormatError, from_dict
from ui.views import engine_metrics
from ui.views import requests as rq
from ui.views.text import md_text
from ui.widgets import display, guard, keys

ROWS, RECORDS, SOURCE_URL, PICK, OPENED = "rq.rows", "rq.records", "rq.url", "rq.pick", "rq.opened"
URL, FETCH, UPLOAD, OPEN, MEASURE, TABLE, TELEMETRY = ("rq.url_in", "rq.fetch", "rq.upload", "rq.open",
                                                       "rq.measure", "rq.table", "rq.telemetry")
LOG_PATH = "/v1/decodescope/requests"
TIMEOUT_S = 10
ADDRESS_ENV = "DECODESCOPE_REQUESTS_ADDRESS"   # "off": log files only, no address a visitor can make it GET


class FetchError(ValueError):
    """A server that could not be read: one line."""


def base_url(text: str) -> str:
    """`text` as a server's root (http or https, a host; a trailing /v1 or / dropped)."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"url={text.strip()[:80]!r} is not an http:// or https:// address of a server")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def get_json(url: str, limit: int):
    """GET `url` as JSON, at most `limit` bytes."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            raw = reply.read(limit + 1)
    except urllib.error.HTTPError as err:
        raise FetchError(f"{url[:120]} answered {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"{url[:120]} could not be read ({str(getattr(err, 'reason', err))[:80]})") from None
    if len(raw) > limit:
        raise FetchError(f"{url[:120]} sent more than {limit:,} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise FetchError(f"{url[:120]} did not send JSON") from None


def fetch_rows(root: str) -> list[rq.Served]:
    listing = get_json(root + LOG_PATH, rq.MAX_RECORD_BYTES)
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise FetchError(f"{root[:120]}{LOG_PATH} is not a request list (no data field)")
    return [rq.parse_record(r, f"{LOG_PATH}[{i}]") for i, r in enumerate(data[-rq.MAX_RECORDS:])]


def read_uploads(files) -> tuple[list[rq.Served], dict[str, dict]]:
    """The uploaded records checked, and each one's whole record by request id (for its trace)."""
    rows, records = [], {}
    for upload in files[: rq.MAX_RECORDS]:
        if upload.size > rq.MAX_RECORD_BYTES:
            raise rq.RequestLogError(f"{upload.name}: {upload.size:,} bytes is over the "
                                     f"{rq.MAX_RECORD_BYTES:,} byte limit")
        try:
            record = json.loads(upload.getvalue())
        except (ValueError, RecursionError):
            raise rq.RequestLogError(f"{upload.name}: not valid JSON") from None
        row = rq.parse_record(record, upload.name)
        rows.append(row)
        records[row.request_id] = record
    return rows, records


def address_setting() -> tuple[bool, str | None]:
    """Whether the page shows the server address field (DECODESCOPE_REQUESTS_ADDRESS unset or `on`) or reads
    log files only (`off`); any other value is taken as `off`, with a line saying so."""
    value = os.environ.get(ADDRESS_ENV, "").strip()
    if value.lower() in ("", "on"):
        return True, None
    if value.lower() == "off":
        return False, None
    return False, f"{ADDRESS_ENV}={value[:40]!r} is not on or off; the server address field is off"


def choose_source() -> None:
    """The log from a server or from files, into session state; a bad source is one line. With the address field
    off (ADDRESS_ENV), files only: the page never fetches."""
    allowed, problem = address_setting()
    if problem:
        st.error(md_text(problem))
    where = "Log files"
    if allowed:
        where = st.segmented_control("Read the request log from", ["A running server", "Log files"],
                                     default="A running server", key="rq.where")
    else:
        st.caption(f"Reading a running server is turned off on this app (`{ADDRESS_ENV}`): upload the log's files.")
    try:
        if where == "Log files":
            files = st.file_uploader("Request-log files (.json, from the cache folder's serve/requests/)",
                                     type=["json"], accept_multiple_files=True, key=guard.uploader_key(UPLOAD))
            if files:
                rows, records = read_uploads(files)
                st.session_state.update({ROWS: rows, RECORDS: records, SOURCE_URL: None})
            return
        url = st.text_input("Server address", "http://127.0.0.1:8000", key=URL,
                            help="The address `python -m decoding serve` printed at its start")
        if st.button("Read its request log", key=FETCH):
            root = base_url(url)
            st.session_state.update({ROWS: fetch_rows(root), RECORDS: {}, SOURCE_URL: root})
    except (FetchError, rq.RequestLogError) as err:
        for key in (ROWS, RECORDS, SOURCE_URL):
            st.session_state.pop(key, None)
        st.error(md_text(str(err)))


def show_summary(rows: list[rq.Served]) -> None:
    strategies = rq.by_strategy(rows)
    st.caption(f"{len(rows)} requests · strategies: {md_text(', '.join(strategies))}. Percentiles interpolate "
               "linearly between the closest ranks (as bench/serve.py computes them); with few requests P99 is "
               "close to the slowest.")
    table = rq.percentile_table(rows)
    st.dataframe(table, hide_index=True, width="stretch", height=rq.table_height(len(table)))
    measure = st.segmented_control("Histogram of", list(rq.MEASURES), default="e2e_s", key=MEASURE,
                                   format_func=rq.MEASURES.get) or "e2e_s"
    display.plot(rq.latency_histogram(rows, measure), "rq.hist", f"requests-{measure}-histogram")
    with st.expander("Drafts accepted, per strategy"):
        for n, (strategy, group) in enumerate(strategies.items()):
            acc = rq.acceptance_of([r for row in group for r in row.rounds], strategy)
            st.text(rq.acceptance_line(acc))
            if acc.per_pos:
                display.plot(rq.acceptance_figure(acc), f"rq.acc.{n}", f"requests-acceptance-{n + 1}")


def show_requests(rows: list[rq.Served]) -> None:
    """The table, slowest first; a click on a row (or the picker under it) opens that request's trace."""
    full = rq.requests_table(rows)
    table = full[list(rq.MAIN_COLUMNS)]
    picked = st.dataframe(table, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                          key=TABLE, height=rq.table_height(len(table)))
    with st.expander("Every column (time to first token, mean gap between tokens, finish)"):
        st.dataframe(full, hide_index=True, width="stretch", height=rq.table_height(len(full)))
    chosen = picked.selection.rows if picked is not None and hasattr(picked, "selection") else []
    ids = list(table["Request"])
    if chosen:
        open_trace(ids[chosen[0]])
    pick = st.selectbox("Request", ids, key=PICK, index=None, placeholder="Choose a request to open its trace")
    if st.button("Open its trace", key=OPEN, disabled=pick is None):
        open_trace(pick)


def open_trace(request_id: str) -> None:
    """The request's trace into the Traces page's replay, then that page; a bad trace is one line."""
    record = st.session_state.get(RECORDS, {}).get(request_id)
    try:
        if record is None:
            root = st.session_state.get(SOURCE_URL)
            if not root or not address_setting()[0]:
                raise FetchError(f"request {request_id[:80]!r} is not in the log read")
            record = get_json(f"{root}{LOG_PATH}/{urllib.parse.quote(request_id, safe='')}", rq.MAX_RECORD_BYTES)
        trace = from_dict(record.get("trace") if isinstance(record, dict) else None)
    except (FetchError, TraceFormatError) as err:
        st.error(f"Request {md_text(request_id[:80])}: its trace could not be opened: {md_text(str(err))}")
        return
    st.session_state[keys.REPLAY] = trace
    st.session_state.pop(keys.REPLAY_CURSOR, None)
    row = next((r for r in st.session_state.get(ROWS, []) if r.request_id == request_id), None)
    st.session_state[OPENED] = (trace, rq.timing_line(row) if row else None)
    st.switch_page("app_pages/traces.py")


def show_opened(replay) -> None:
    """On the Traces page: the served request's timing above the trace opened from the Requests page."""
    opened = st.session_state.get(OPENED)
    if opened and opened[0] is replay and opened[1]:
        st.caption(md_text(opened[1]))


def show_telemetry() -> None:
    """Engines' exported spec-decode numbers (vLLM /metrics text; vLLM, SGLang or llama.cpp replies)."""
    files = st.file_uploader("Engine telemetry: a vLLM /metrics dump (.txt, .prom), or vLLM, SGLang or llama.cpp "
                             "replies (.json)", type=["txt", "prom", "json"], accept_multiple_files=True,
                             key=guard.uploader_key(TELEMETRY))
    for n, upload in enumerate(files or []):
        try:
            acc = engine_metrics.read(upload.getvalue(), upload.name)
        except rq.RequestLogError as err:
            st.error(md_text(str(err)))
            continue
        st.text(rq.acceptance_line(acc))
        if acc.per_pos:
            display.plot(rq.acceptance_figure(acc), f"rq.tel.{n}", f"telemetry-acceptance-{n + 1}")
