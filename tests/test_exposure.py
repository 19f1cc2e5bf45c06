"""The app serves this machine only unless told otherwise: `streamlit run app.py` with the project's
.streamlit/config.toml listens on 127.0.0.1 alone (read from the kernel's socket table), `make run`
passes DECODESCOPE_HOST (default 127.0.0.1) as the address, and unexpected errors show no details on a
page. Negative control: the same server told `--server.address 0.0.0.0` is seen listening on every
interface."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from bench.browser import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "0100007F"          # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)


def listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) with a socket listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:            # 0A: LISTEN
                found.add(address)
    return found


def addresses_served(*extra: str) -> set[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
           "--server.port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        return listening(port)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net/tcp")
@pytest.mark.slow
def test_the_app_listens_on_loopback_only():
    assert addresses_served() == {LOOPBACK}


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net/tcp")
@pytest.mark.slow
def test_check_sees_a_server_on_every_interface():
    served = addresses_served("--server.address", "0.0.0.0")
    assert served and LOOPBACK not in served         # 00000000 (every IPv4 interface) or :: in tcp6


def make_run_line(env: dict[str, str]) -> str:
    """The streamlit command `make run` would run with `env` (and no DECODESCOPE_HOST of the caller's)."""
    base = {k: v for k, v in os.environ.items() if k != "DECODESCOPE_HOST"}
    done = subprocess.run(["make", "-n", "run"], cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, check=True)
    return next(line for line in done.stdout.splitlines() if "streamlit run" in line)


def test_make_run_serves_loopback_unless_told():
    assert "--server.address 127.0.0.1 " in make_run_line({})
    assert "--server.address 0.0.0.0 " in make_run_line({"DECODESCOPE_HOST": "0.0.0.0"})


def test_config_hides_error_details_and_binds_loopback():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["client"]["showErrorDetails"] == "none"
    assert config["server"]["address"] == "127.0.0.1"
