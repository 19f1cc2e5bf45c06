"""Streamlit-side helpers. figures, tables, chips, params, live and metrics are pure (no streamlit);
sidebar, session and views draw widgets."""
