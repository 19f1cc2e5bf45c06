"""params.link_safe: an error about a server path a link set says only that the value cannot be used,
the same line whatever the cause; the same value typed in the sidebar (or another parameter's error)
keeps its full message. The app-level cases are in test_bad_input.py (test_app_link_paths_...)."""
from __future__ import annotations

from ui.widgets.params import LINK_PATHS, link_safe, path_values

MISSING = "model='/srv/x' is invalid: no such file or directory"
NOT_DIR = "model='/srv/x' is invalid: must be a directory or a .gguf file"


def test_a_links_path_gets_one_line_whatever_the_cause():
    link = {"model": "/srv/x"}
    masked = {link_safe(m, link, link) for m in (MISSING, NOT_DIR)}
    assert len(masked) == 1
    (line,) = masked
    assert line.startswith("model='/srv/x' from the link cannot be used") and "no such" not in line


def test_typed_or_other_values_keep_the_full_message():
    assert link_safe(MISSING, {"model": "/srv/x"}, {"model": "/srv/y"}) == MISSING     # edited since
    assert link_safe(MISSING, {}, {"model": "/srv/x"}) == MISSING                      # not from a link
    other = "top_k=-1 is invalid: must be an integer >= 0"
    assert link_safe(other, {"model": "/srv/x"}, {"model": "/srv/x"}) == other


def test_path_values_picks_the_path_parameters_only():
    values = path_values({"model": " /srv/x ", "prompt": "hi", "gguf_file": "w.gguf"},
                         {"draft": "shallow:/srv/d", "gamma": 4})
    assert values == {"model": "/srv/x", "gguf_file": "w.gguf", "draft": "shallow:/srv/d"}
    assert set(LINK_PATHS) == {"model", "gguf_file", "draft", "drafter"}
