"""Tour: the decoding story as a sequence of stops, each with a recorded trace (shown without a model)
and a button to re-run it live."""
from ui.widgets import tour_page

tour_page.render()
