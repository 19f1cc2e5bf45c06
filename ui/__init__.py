"""Streamlit-side helpers. Pure (no streamlit): keys, palette, chips, figures, tables, params, live.
Drawing widgets: sidebar, session, views, stepper."""
