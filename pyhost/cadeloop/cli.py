"""The `cadeloop` command line: `cadeloop APP [options]`.

Every setting flag is generated from the settings table (cadeloop.config).
Settings are resolved (defaults < TOML file < environment < flags < APP)
before the app is imported and before anything binds; a bad value from any
source is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import traceback
from typing import Any, NoReturn, Sequence

from . import _core
from ._log import apply_log_level, configure_logging
from ._dropin import apply_log_config, load_env_file
from ._reload import run_with_reload
from .config import SETTINGS, SettingError, format_config, reference, resolve
from .server import AppLoadError, Server, StartupError, load_app


def version_text() -> str:
    """What `cadeloop --version` prints: our version, the Python, own-GIL support."""
    impl = platform.python_implementation()
    py = platform.python_version()
    if _core.own_gil_supported():
        isolation = "own-GIL sub-interpreters: yes"
    else:
        isolation = "own-GIL sub-interpreters: no (needs CPython 3.12+; worker processes are used)"
    return f"cadeloop {_core.__version__} on {impl} {py} ({sys.executable}); {isolation}"


_METAVARS = {"int": "N", "size": "SIZE", "duration": "DURATION", "float": "X", "str": "TEXT"}


class _SettingFlag(argparse.Action):
    """Records ("--flag", text) in order; the settings table reads and checks the text later."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        flags = list(getattr(namespace, self.dest) or [])
        flags.append((option_string or "", values if isinstance(values, str) else ""))
        setattr(namespace, self.dest, flags)


def _error(line: str) -> None:
    """One line for the user, "cadeloop: <line>", through the native server log at error level.

    Error is the most severe --log-level, so the line shows whatever the level.
    """
    sys.stderr.flush()  # what Python printed before it (a usage line, a traceback) comes first
    _core.log(logging.ERROR, line)


class _Parser(argparse.ArgumentParser):
    """argparse, with its one-line errors ("cadeloop: error: ...", exit 2) through the server log."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        _error(f"error: {message}")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cadeloop",
        allow_abbrev=False,
        description="Serve an ASGI app on core pairs: a native I/O thread and a Python app thread each.",
        epilog="Settings also come from a TOML file (--config, or $CADELOOP_CONFIG) and CADELOOP_<NAME> "
        "environment variables; flags override both. See docs/configuration.md. "
        "Exit codes: 0 stopped by SIGINT/SIGTERM, 1 start failed (address in use, error importing the app), "
        "2 bad command line or setting, or APP not found, 3 lifespan startup failed.",
    )
    parser.set_defaults(setting_flags=None)
    parser.add_argument("app", nargs="?", metavar="APP",
                        help="the ASGI app as module:attribute, e.g. main:app (or `app` in the settings file)")
    parser.add_argument("--version", action="store_true", help="print the version, the Python and own-GIL support, then exit")
    parser.add_argument("--config", metavar="FILE", help="read settings from this TOML file (default: $CADELOOP_CONFIG)")
    parser.add_argument("--print-config", action="store_true",
                        help="print every resolved setting, its value and where it came from, then exit")
    parser.add_argument("--print-reference", action="store_true",
                        help="print the settings reference (docs/configuration.md) in Markdown, then exit")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, row in SETTINGS.items():
        if name == "app":
            continue  # the positional APP
        group = groups.get(row["section"])
        if group is None:
            group = groups[row["section"]] = parser.add_argument_group(row["section"].lower())
        notes = [f"default {row['default_text'] or chr(34) * 2}"]
        if row["min_text"] is not None:
            notes.append(f"{row['min_text']}..{row['max_text']}")
        if row["nullable"]:
            notes.append(f"none: {row['none_means']}")
        text = f"{row['doc']} ({'; '.join(notes)})".replace("%", "%%")
        if row["kind"] == "bool":
            group.add_argument(row["flag"], "--no-" + row["flag"][2:], *row["aliases"], dest="setting_flags",
                               nargs=0, action=_SettingFlag, help=text)
            continue
        metavar = "{" + ",".join(row["choices"]) + "}" if row["choices"] else _METAVARS[row["kind"]]
        group.add_argument(row["flag"], *row["aliases"], dest="setting_flags", action=_SettingFlag, metavar=metavar,
                           help=text)
        if row["off_flag"]:
            group.add_argument(row["off_flag"], dest="setting_flags", nargs=0, action=_SettingFlag,
                               help=f"same as {row['flag']} \"\"")
    return parser


#: Settings whose flag may be repeated, each time adding a line (uvicorn's --header).
REPEATABLE = ("headers", "reload_dirs", "reload_include", "reload_exclude")


def merge_repeated(flags: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The flags with every repeat of a REPEATABLE setting's flag (or alias) joined into one, by lines."""
    names = {SETTINGS[n]["flag"]: n for n in REPEATABLE}
    names.update({a: n for n in REPEATABLE for a in SETTINGS[n]["aliases"]})
    out: list[tuple[str, str]] = []
    joined: dict[str, int] = {}
    for flag, text in flags:
        name = names.get(flag)
        if name is None:
            out.append((flag, text))
        elif name in joined:
            prev_flag, prev = out[joined[name]]
            out[joined[name]] = (prev_flag, prev + "\n" + text)
        else:
            joined[name] = len(out)
            out.append((flag, text))
    return out


def parse_settings(argv: Sequence[str], environ: dict[str, str] | None = None) -> Any:
    """`cadeloop ARGV` read as far as the resolved settings, nothing started: a `Resolved`.

    For tests and the migration guide's check. Raises SettingError, or
    SystemExit(2) for a command line argparse refuses.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        unknown = next((a for a in extra if a.startswith("-")), None)
        if unknown is not None:
            resolve(flags=[(unknown.partition("=")[0], "")])
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return resolve(file=args.config, environ=environ, flags=merge_repeated(args.setting_flags or ()),
                   arguments={"app": args.app} if args.app else None, arguments_origin="argument APP")


def _fail(line: str) -> int:
    _error(line)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        unknown = next((a for a in extra if a.startswith("-")), None)
        if unknown is None:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            resolve(flags=[(unknown.partition("=")[0], "")])
        except SettingError as exc:
            return _fail(str(exc))
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.version:
        print(version_text())
        return 0
    if args.print_reference:
        sys.stdout.write(reference())
        return 0

    flags = merge_repeated(args.setting_flags or ())
    arguments = {"app": args.app} if args.app else None
    try:
        resolved = resolve(file=args.config, environ=os.environ, flags=flags, arguments=arguments,
                           arguments_origin="argument APP")
        if resolved.config.env_file:
            # Before the app is imported; its CADELOOP_* variables count too, so the settings are read again.
            load_env_file(resolved.config.env_file)
            resolved = resolve(file=args.config, environ=os.environ, flags=flags, arguments=arguments,
                               arguments_origin="argument APP")
        if resolved.config.log_config and not args.print_config:
            apply_log_config(resolved.config.log_config)
    except SettingError as exc:
        return _fail(str(exc))
    if args.print_config:
        sys.stdout.write(format_config(resolved))
        return 0
    config = resolved.config
    if not config.app:
        parser.print_usage(sys.stderr)
        return _fail("missing APP, the ASGI app to serve as module:attribute (e.g. cadeloop main:app)")

    configure_logging()
    apply_log_level(config.log_level)
    if config.reload:
        if config.cores != 1:
            return _fail(f"--reload: serves one core pair and restarts it on a change; cores is {config.cores} "
                         f"({resolved.origins.get('cores', 'a setting')}): drop --cores/--workers, or --reload")
        return run_with_reload(list(sys.argv[1:] if argv is None else argv), config)
    # The app is imported and checked before anything binds.
    try:
        app = load_app(config.app, config.app_dir, config.factory)
    except AppLoadError as exc:
        return _fail(str(exc))
    except Exception:
        traceback.print_exc()
        _error(f"importing {config.app!r} raised the exception above")
        return 1
    try:
        Server(app, config).run()
    except StartupError as exc:
        _error(str(exc))
        return exc.exit_code
    return 0
