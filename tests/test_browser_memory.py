"""A real `streamlit run` server that many tabs come to from links with other model keys (issue 47, probe
class 6): its resident memory stays within the model cache's cap however many tabs come and go. Before the
fix every tab whose link named another max_memory (bfloat16) added its copy for good. The embedded model's
numbers in docs/experiments.md: DECODESCOPE_MEMORY_MODEL=default DECODESCOPE_MEMORY_TABS=10 pytest -s
tests/test_browser_memory.py (about 3 minutes)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.browser import CHROMIUM, launch_chromium, streamlit_server
from bench.tiny_model import build_tiny_model_dir
from ui.widgets import session

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 1024                 # 2 layers, tied 49,152-token embedding: 71 M parameters, a 142 MB copy in bfloat16
TABS = int(os.environ.get("DECODESCOPE_MEMORY_TABS", "5"))     # three beyond the cap of two copies

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium package to run the browser tests)",
                allow_module_level=True)
if not os.path.exists("/proc/self/status"):
    pytest.skip("reads a process's resident memory from /proc (Linux)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright for python is not installed")


def children_running(word: str) -> list[int]:
    """Process ids of this process's children whose command line contains `word`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and word in cmdline:
            found.append(int(entry.name))
    return found


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def model_dir(tmp_path: Path) -> tuple[str, Path]:
    """The model the server runs (DECODESCOPE_MEMORY_MODEL, else a wide tiny llama) and its weights' folder."""
    from decoding.runtime.models import _gguf_cache_dir, embedded_gguf_path

    name = os.environ.get("DECODESCOPE_MEMORY_MODEL")
    if name == "default":
        return name, _gguf_cache_dir(embedded_gguf_path())
    if name:
        return name, Path(name)
    folder = build_tiny_model_dir(tmp_path / "wide", hidden=HIDDEN)
    return str(folder), folder


def bf16_copy_mib(folder: Path) -> float:
    """A bfloat16 copy of the float32 weights in `folder` (MiB)."""
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2 / 2**20


def visit(browser, url: str, query: str) -> None:
    """Open the link in a tab of its own, press Step, wait for its token, close the tab."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{url}/?{query}")
    page.get_by_role("button", name="Step", exact=True).wait_for(timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=30_000)
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_selector(".ds-chips span.ds-chip", timeout=60_000)
    context.close()


def test_tabs_with_other_max_memory_leave_the_server_within_the_cap(tmp_path):
    assert session.TARGET_COPIES == 2             # the bound below counts two copies
    model, folder = model_dir(tmp_path)
    copy_mib = bf16_copy_mib(folder)
    env = {**os.environ, "DECODESCOPE_MODEL": model}
    with streamlit_server(ROOT / "app.py", env, tmp_path / "streamlit.log", cwd=ROOT) as url, \
            sync_api.sync_playwright() as playwright:
        [pid] = children_running("streamlit")
        browser = launch_chromium(playwright)
        after = []
        for tab in range(TABS):
            visit(browser, url, f"dtype=bfloat16&device_map=auto&max_memory=cpu%3D{tab + 1}GiB&max_new=3")
            time.sleep(1)
            after.append(resident_mib(pid))
        browser.close()
    print(f"\nserver resident MiB after each tab: {[round(a) for a in after]} (a copy: {copy_mib:.0f} MiB)")
    grown = [round(b - a) for a, b in zip(after, after[1:])]
    assert after[1] - after[0] > 0.7 * copy_mib, f"control: the second copy is seen ({grown} MiB per tab)"
    assert max(after[2:]) < after[1] + copy_mib, f"{[round(a) for a in after]} MiB after each tab"
