"""Running the CLI in this process, and what its errors must look like (one line, no traceback)."""
from __future__ import annotations

import pytest

from decoding import __main__ as cli


def cli_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """python -m decoding ... in this process: (exit status, stdout, stderr). Ctrl-C escaping main is a
    failure here, not the end of the test session."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped the CLI")
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(text: str) -> str:
    """The one line of an error message or of stderr: no second line, no blank line between, no traceback."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


NOT_UTF8 = "w1 \udcff w2"                  # what Python makes of the argv bytes b"w1 \xff w2" (surrogateescape)
