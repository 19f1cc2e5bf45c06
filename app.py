"""DecodeScope: page config, the shared sidebar, and the router over the pages."""
import streamlit as st

from ui import keys, sidebar

st.set_page_config(page_title="DecodeScope", page_icon="🔎", layout="wide")

st.session_state[keys.SETTINGS] = sidebar.render()

pages = st.navigation([
    st.Page("app_pages/playground.py", title="Playground", icon="▶️", default=True),
    st.Page("app_pages/compare.py", title="Compare", icon="⚖️"),
    st.Page("app_pages/traces.py", title="Traces", icon="💾"),
])
pages.run()
