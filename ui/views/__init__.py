"""Pure view builders: a trace's events in, plotly figures, pandas tables, HTML or DOT strings out.
No streamlit here (tests/test_ui_layout.py checks); ui/widgets shows what these build."""
