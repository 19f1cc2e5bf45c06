"""DecodeScope: page config, the shared sidebar, and the router over the pages."""
import streamlit as st

from decoding.runtime.engine_thread import ENGINE, threads_beside_ui
from ui.widgets import (
    guard,
    keys,
    sidebar,
    strategy_panels,  # noqa: F401  (registers the beam, speculative and dspark views)
)

st.set_page_config(page_title="DecodeScope", page_icon=":material/search:", layout="wide")
# Every rerun runs in a thread of its own: the tensor work goes to one engine thread, with one core left
# to the server and the browser (at the first run; later calls do nothing).
ENGINE.enable(threads=threads_beside_ui())

st.session_state[keys.SETTINGS] = sidebar.render()

pages = st.navigation([
    st.Page("app_pages/playground.py", title="Playground", icon=":material/play_arrow:", default=True),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("app_pages/whatif.py", title="What-if", icon=":material/insights:"),
    st.Page("app_pages/traces.py", title="Traces", icon=":material/save:"),
    st.Page("app_pages/lab.py", title="Lab", icon=":material/science:"),
    st.Page("app_pages/tour.py", title="Tour", icon=":material/school:"),
])
guard.show_note()
try:
    pages.run()
except Exception as err:          # a failure no check caught: one line here, the traceback in the server's log
    guard.recover(err)
else:
    guard.page_done()
