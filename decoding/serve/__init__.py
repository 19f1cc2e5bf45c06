"""`python -m decoding serve`: an OpenAI-compatible HTTP endpoint over the engine (docs/serve.md).

Not a production server: requests wait in one first-come queue and decode one at a time on the engine
thread, with no batching. The modules, in the order a request meets them:

    flags.py      the command line's serve flags (address, port, the request log's bounds)
    cli.py        start-up: load the model, build the app, run uvicorn
    body.py       a request body read and checked: OpenAI's fields and the one `decodescope` field
    settings.py   a request's strategy and settings, checked by the command line's own rules
    server.py     what the routes share: the model, the settings, the queue, the metrics, the log
    worker.py     the first-come queue on the engine thread, and each request's timeline
    replies.py    OpenAI's response shapes, whole and streamed (server-sent events)
    text.py       a growing answer's text handed out in pieces that add up to the whole
    metrics.py    /metrics: latency histograms and vLLM's speculative counters (prometheus-client)
    trace_log.py  every request's trace on disk, bounded in count and bytes, oldest dropped
    app.py        the routes (Starlette)

Never imports streamlit, plotly or pandas."""
