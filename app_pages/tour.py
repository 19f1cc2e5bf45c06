"""Tour: the decoding story as a sequence of stops, each with a recorded trace (shown without a model)
and a button to re-run it live."""
from ui import tour_view

tour_view.render()
