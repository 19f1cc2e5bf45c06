"""One module per decoding strategy: each a generator of step events (see decoding.runner)."""
