"""serve()'s docstring shows the settings' real defaults (issue 14: it showed 16MiB and 30s)."""

from __future__ import annotations

import re

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
