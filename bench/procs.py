"""What the benchmarks that start a server share: a free loopback port, stopping the process, a
comma-separated list of client counts, and their flags' ranges."""
from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """Ask the process to end; kill it when it has not within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def client_counts(text: str, flag: str, most: int) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8), each between 1 and `most`; otherwise ValueError naming `flag`."""
    try:
        parsed = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be numbers separated by commas, got {text!r}") from None
    if not parsed or any(not 1 <= n <= most for n in parsed):
        raise ValueError(f"{flag} must each be between 1 and {most}, got {text!r}")
    return parsed


def check_ranges(args, ranges: dict[str, tuple[float, float, str]]) -> None:
    """Each flag's value within its (lowest, highest, unit) range, both included; otherwise SystemExit with one
    line naming the flag and the value."""
    for flag, (lowest, highest, unit) in ranges.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if not lowest <= value <= highest:
            raise SystemExit(f"{flag} must be between {lowest:g} and {highest:g}{unit}, got {value!r}")
