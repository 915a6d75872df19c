"""docs/migrating-from-uvicorn.md: every uvicorn command line in it parses, under cadeloop, to the settings it documents.

Each `sh` block of the guide holds a `uvicorn ...` line and a `# settings:`
line written as `--print-config` writes values. The line is split as a shell
would, `uvicorn` is replaced by cadeloop's parser (nothing is started), and
every documented setting must have that value and come from the command line.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cadeloop import _core
from cadeloop.cli import parse_settings

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-uvicorn.md"
BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
PAIR = re.compile(r'(\w+) = ("(?:[^"\\]|\\.)*"|[^,\s]+)')


def documented() -> list[tuple[str, dict[str, str]]]:
    out = []
    for block in BLOCK.findall(GUIDE.read_text()):
        lines = block.strip().splitlines()
        command = next(line for line in lines if line.startswith("uvicorn "))
        settings = next(line for line in lines if line.startswith("# settings:"))
        out.append((command, dict(PAIR.findall(settings.partition(":")[2]))))
    return out


def test_the_guide_has_command_lines() -> None:
    assert len(documented()) >= 6


@pytest.mark.parametrize("command, settings", documented(), ids=lambda v: v if isinstance(v, str) else "")
def test_uvicorn_command_line_parses_to_the_documented_settings(command: str, settings: dict[str, str]) -> None:
    argv = shlex.split(command)[1:]
    resolved = parse_settings(argv, environ={})
    assert settings
    for name, text in settings.items():
        value = getattr(resolved.config, name)
        assert _core.format_setting(name, value, toml=True) == text, (name, command)
        assert resolved.origins[name] != "default", (name, "was not set by the command line")
