"""DecodeScope: page config, the shared sidebar, and the router over the pages."""
import streamlit as st

from ui.widgets import (
    engine,
    guard,
    keys,
    sidebar,
    strategy_panels,  # noqa: F401  (registers the beam, speculative and dspark views)
)

st.set_page_config(page_title="DecodeScope", page_icon=":material/search:", layout="wide")
# Projector first (1280×800, issue 46): less padding around the main column; text that Streamlit cuts
# with an ellipsis when its box is narrow (a button's, a metric's label and value, a widget's label, a tab's)
# wraps instead; metric values a size smaller, so a row of six fits. Checked by tests/test_browser_layout.py.
st.html("""<style>
[data-testid="stMainBlockContainer"] { padding: 3.5rem 2rem 4rem 2rem; }
[data-testid="stMain"] button { padding-left: 0.5rem; padding-right: 0.5rem; }
button [data-testid="stMarkdownContainer"], [data-testid="stMetricLabel"] [data-testid="stMarkdownContainer"],
[data-testid="stMetricValue"] > div, [data-testid="stWidgetLabel"] [data-testid="stMarkdownContainer"],
[data-testid="stTab"] [data-testid="stMarkdownContainer"], [data-testid="stExpander"] summary
  [data-testid="stMarkdownContainer"] { white-space: normal; overflow: visible; text-overflow: clip;
  overflow-wrap: anywhere; }
button [data-testid="stMarkdownContainer"] p { white-space: normal; }
[data-testid="stMetricValue"] { font-size: 1.75rem; }
</style>""")
# Every rerun runs in a thread of its own: the tensor work goes to one engine thread, with one core left
# to the server and the browser (at the first run; later calls do nothing).
engine.ENGINE.enable(threads=engine.threads_beside_ui())

st.session_state[keys.SETTINGS] = sidebar.render()

pages = st.navigation([
    st.Page("app_pages/playground.py", title="Playground", icon=":material/play_arrow:", default=True),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("app_pages/whatif.py", title="What-if", icon=":material/insights:"),
    st.Page("app_pages/traces.py", title="Traces", icon=":material/save:"),
    st.Page("app_pages/requests.py", title="Requests", icon=":material/dns:"),
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
