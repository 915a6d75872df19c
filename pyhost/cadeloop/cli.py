"""The `cadeloop` command line: `cadeloop APP [options]`."""

from __future__ import annotations

import argparse
import platform
import sys
import traceback
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    from .server import SETTINGS, Config

    defaults = Config()
    parser = argparse.ArgumentParser(
        prog="cadeloop",
        description="Serve an ASGI app on a core pair: a native I/O thread and a Python app thread.",
        epilog="Exit codes: 0 stopped by SIGINT/SIGTERM, 1 start failed (address in use, error importing the app), "
        "2 bad command line or APP not found, 3 lifespan startup failed.",
    )
    parser.add_argument("app", nargs="?", metavar="APP", help="the ASGI app as module:attribute, e.g. main:app")
    parser.add_argument("--version", action="store_true", help="print the version, the Python and own-GIL support, then exit")
    parser.add_argument("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on, 0 for any (default %(default)s)")
    parser.add_argument("--uds", metavar="PATH", help="listen on a Unix socket instead")
    parser.add_argument("--fd", type=int, help="serve an inherited listening socket (systemd socket activation)")
    parser.add_argument("--app-dir", metavar="DIR", help="import APP from DIR (default: the current directory)")
    parser.add_argument("--factory", action="store_true", help="APP is a factory: call it to get the app")
    parser.add_argument("--root-path", default="", metavar="P", help="the ASGI root_path (mount point behind a proxy)")
    parser.add_argument("--lifespan", choices=("auto", "on", "off"), default="auto", help="ASGI lifespan protocol (default auto)")
    parser.add_argument("--cores", type=int, default=1, help="core pairs (only 1 for now)")
    parser.add_argument("--isolation", choices=("auto", "subinterpreters", "processes"), default="auto",
                        help="where each pair's interpreter lives (default auto)")
    parser.add_argument("--pin", action="store_true", help="tie each pair's two threads to one CPU set")
    parser.add_argument("--server-header", default=defaults.server_header, help="Server header value ('' for none)")
    parser.add_argument("--stats-json-on-exit", metavar="FILE",
                        help="write the pair's counters as JSON to FILE at exit (and on SIGUSR1)")
    for name, (kind, low, high, text) in SETTINGS.items():
        parser.add_argument(_flag(name), type=kind, default=getattr(defaults, name), metavar="N",
                            help=f"{text} (default %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_text())
        return 0
    if not args.app:
        parser.print_usage(sys.stderr)
        print("cadeloop: missing APP, the ASGI app to serve as module:attribute (e.g. cadeloop main:app)", file=sys.stderr)
        return 2

    from .server import AppLoadError, Config, Server, StartupError, _configure_logging, load_app

    settings = {k: v for k, v in vars(args).items() if k not in ("app", "version")}
    config = Config(app=args.app, **settings)
    try:
        config.check()
    except ValueError as exc:
        print(f"cadeloop: {exc}", file=sys.stderr)
        return 2
    _configure_logging()
    # The app is imported and checked before anything binds.
    try:
        app = load_app(args.app, config.app_dir, config.factory)
    except AppLoadError as exc:
        print(f"cadeloop: {exc}", file=sys.stderr)
        return 2
    except Exception:
        traceback.print_exc()
        print(f"cadeloop: importing {args.app!r} raised the exception above", file=sys.stderr)
        return 1
    try:
        Server(app, config).run()
    except StartupError as exc:
        print(f"cadeloop: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
