"""The app's UI. ui/views: pure view builders (trace -> plotly figures, pandas tables, HTML, DOT; no
streamlit). ui/widgets: the streamlit widgets and panels that show them, and the state behind them."""
