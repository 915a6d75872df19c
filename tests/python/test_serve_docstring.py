"""What a new user reads matches what cadeloop does: serve()'s defaults, and keepalive_idle's range (issue 14)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cadeloop.config import SETTINGS
from cadeloop.server import serve

SHOWN = re.compile(r"\b([a-z_]+)=(\"[^\"]*\"|\d+)")


def test_every_default_serve_shows_is_the_tables() -> None:
    doc = serve.__doc__ or ""
    shown = {name: value.strip('"') for name, value in SHOWN.findall(doc)}
    assert {"cores", "grace", "max_body", "keepalive_idle"} <= set(shown), doc
    for name, value in shown.items():
        assert SETTINGS[name]["default_text"] == value, f"serve() shows {name}={value!r}"
    m = re.search(r'\("([\d.]+)", (\d+)\)', doc)
    assert m and (m.group(1), m.group(2)) == (SETTINGS["host"]["default_text"], SETTINGS["port"]["default_text"])


@pytest.mark.parametrize("flag", ["--keepalive-idle", "--timeout-keep-alive"])
def test_keepalive_idle_0_is_refused_as_the_reference_says(flag: str) -> None:
    """docs/configuration.md gives keepalive_idle the range 1ms .. 24h: 0 is refused in one line, exit 2."""
    reference = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert re.search(r"`keepalive_idle`.*\| 1ms \.\. 24h \|", reference)
    p = subprocess.run([sys.executable, "-m", "cadeloop", "main:app", flag, "0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert p.stderr == f"cadeloop: {flag}: keepalive_idle: must be between 1ms and 24h, got 0\n"
