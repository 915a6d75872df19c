"""The `cadeloop` command line."""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Sequence

from . import _core


def version_text() -> str:
    """What `cadeloop --version` prints: our version, the Python, own-GIL support."""
    impl = platform.python_implementation()
    py = platform.python_version()
    if _core.own_gil_supported():
        isolation = "own-GIL sub-interpreters: yes"
    else:
        isolation = "own-GIL sub-interpreters: no (needs CPython 3.12+; worker processes are used)"
    return f"cadeloop {_core.__version__} on {impl} {py} ({sys.executable}); {isolation}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadeloop",
        description="Serve an ASGI app on every core: a native I/O thread and a Python app thread per core.",
    )
    parser.add_argument("--version", action="store_true", help="print the version, the Python and own-GIL support, then exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_text())
        return 0
    parser.print_usage(sys.stderr)
    print("cadeloop: serving an app arrives with the core-pair server; for now try --version", file=sys.stderr)
    return 2
