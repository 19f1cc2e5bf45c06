"""Streamlit widgets and panels that show what ui/views builds, and the state behind them (widget keys,
settings, the live run, what forcing a candidate emits)."""
