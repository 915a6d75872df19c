"""Every row of the settings table is reachable from every source, and reaches the C++ options.

For each setting a valid value other than its default is given once from a
TOML file, once as a CADELOOP_* variable, once as a command-line flag, and
once as a serve() and a Config() argument; each time the resolved Config must
hold it (and say where it came from). For the settings the core pair
consumes, the value must then arrive in the pair's C++ options
(_core.pair_options_preview reads the option fields back in the setting's
terms); every other setting must be named below with the part that reads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cadeloop
from cadeloop import _core
from cadeloop import config as cfg

ROOT = Path(__file__).resolve().parents[2]

#: Settings the core pair does not consume, and what reads them instead.
NOT_FOR_THE_PAIR = {
    "app": "the server imports it (cadeloop.server.load_app)",
    "app_dir": "the server imports the app from there",
    "factory": "the server calls the app factory",
    "lifespan": "the lifespan protocol runs in Python (cadeloop.server)",
    "cores": "the supervisor starts that many pairs",
    "isolation": "the supervisor chooses sub-interpreters or processes",
    "pin": "the supervisor pins each pair",
    "log_level": "Python logging and the native server log (_core.set_log_level)",
    "stats_port": "the stats endpoint (cadeloop._stats)",
    "stats_host": "the stats endpoint (cadeloop._stats)",
    "stats_json_on_exit": "the server writes the counters at exit",
    "stats_allowed_hosts": "the stats endpoint (cadeloop._stats)",
    "spin_us": "the app thread's loop (cadeloop.Loop(spin_us=...))",
    "env_file": "the command line and serve() load it before the settings are read (cadeloop._dropin)",
    "log_config": "Python logging, configured before the app is imported (cadeloop._dropin)",
    "limit_concurrency": "the pair's loop thread admits requests (cadeloop._admission)",
    "limit_max_requests": "the pair counts requests and drains to be replaced (cadeloop._admission)",
    "reload": "the command line runs the server under a watcher (cadeloop._reload)",
    "reload_dirs": "the watcher (cadeloop._reload)",
    "reload_include": "the watcher (cadeloop._reload)",
    "reload_exclude": "the watcher (cadeloop._reload)",
    "serving_processes": "the supervisor spreads the sub-interpreter pairs over them (cadeloop._host)",
    "drain_delay": "the supervisor (or the one pair) waits it out before asking the pairs to drain",
}

#: Values a generic choice would not make valid or telling.
CHOSEN = {
    "app": "main:app",
    "host": "127.0.0.2",
    "stats_host": "127.0.0.3",
    "access_log_format": "json",
    "forwarded_allow_ips": "10.0.0.0/8",
    "headers": "X-Test: 1",
    "env_file": os.devnull,  # the command line reads it
    "uds_mode": "0600",
}


def other_value(name: str, row: dict[str, Any]) -> Any:
    """A valid value of the setting other than its default."""
    if name in CHOSEN:
        return CHOSEN[name]
    kind, default = row["kind"], row["default"]
    if kind in ("int", "size"):
        if default is None:
            return row["min"] + 1
        return default + 1 if default < row["max"] else default - 1
    if kind in ("duration", "float"):
        return default + 1 if default + 1 <= row["max"] else default / 2
    if kind == "bool":
        return not default
    if kind == "choice":
        return next(c for c in row["choices"] if c != default)
    return f"/tmp/cadeloop-{name}"


VALUES = {name: other_value(name, row) for name, row in cfg.SETTINGS.items()}
# uds and fd cannot be given together: each group leaves one of them out.
GROUPS = [[n for n in cfg.SETTINGS if n != "fd"], [n for n in cfg.SETTINGS if n != "uds"]]


def env_name(name: str) -> str:
    return cfg.ENV_PREFIX + name.upper()


def text(name: str) -> str:
    return _core.format_setting(name, VALUES[name])


def flag(name: str) -> tuple[str, str]:
    """The flag and its argument as typed (a boolean flag takes none; false is --no-NAME)."""
    row = cfg.SETTINGS[name]
    if row["kind"] == "bool":
        return (row["flag"] if VALUES[name] else "--no-" + row["flag"][2:]), ""
    return row["flag"], text(name)


def toml_line(name: str) -> str:
    return f"{name} = {_core.format_setting(name, VALUES[name], toml=True)}\n"


def assert_arrives(config: Any, name: str) -> None:
    """The setting's value is in Config and, if the pair consumes it, in every C++ option field it fills."""
    assert getattr(config, name) == VALUES[name], name
    readings = [(field, value) for setting, field, value in _core.pair_options_preview(config.core_options())
                if setting == name]
    if name in NOT_FOR_THE_PAIR:
        assert not readings, f"{name} reaches {readings}: drop it from NOT_FOR_THE_PAIR"
        return
    assert readings, (f"{name} reaches no C++ option: bind it in runtime/pair_settings.cpp, or name what "
                      "reads it in NOT_FOR_THE_PAIR")
    for field, value in readings:
        assert value == VALUES[name], f"{name} = {VALUES[name]!r} arrived in {field} as {value!r}"


@pytest.fixture(autouse=True)
def no_cadeloop_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(cfg.ENV_PREFIX):
            monkeypatch.delenv(key)


def test_every_value_differs_from_the_default() -> None:
    for name, row in cfg.SETTINGS.items():
        assert VALUES[name] != row["default"], name
        assert cfg.Config(**{name: VALUES[name]}) is not None


# --------------------------------------------------------------------------- one setting at a time, in process


@pytest.mark.parametrize("name", list(cfg.SETTINGS))
def test_from_a_toml_file(name: str, tmp_path: Path) -> None:
    path = tmp_path / "cadeloop.toml"
    path.write_text(toml_line(name))
    resolved = cfg.resolve(file=path)
    assert resolved.origins[name] == f"{path}:1"
    assert_arrives(resolved.config, name)


@pytest.mark.parametrize("name", list(cfg.SETTINGS))
def test_from_the_environment(name: str) -> None:
    resolved = cfg.resolve(environ={env_name(name): text(name)})
    assert resolved.origins[name] == f"env {env_name(name)}"
    assert_arrives(resolved.config, name)


@pytest.mark.parametrize("name", [n for n in cfg.SETTINGS if n != "app"])  # the app is an argument, see below
def test_from_a_flag(name: str) -> None:
    resolved = cfg.resolve(flags=[flag(name)])
    assert resolved.origins[name] == f"flag {flag(name)[0]}"
    assert_arrives(resolved.config, name)


@pytest.mark.parametrize("name", list(cfg.SETTINGS))
def test_from_config_arguments(name: str) -> None:
    assert_arrives(cfg.Config(**{name: VALUES[name]}), name)


class _Resolved(Exception):
    """Carries the Config serve() resolved, before anything is imported or bound."""


@pytest.mark.parametrize("name", list(cfg.SETTINGS))
def test_from_serve_arguments(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def caught(self: Any) -> None:
        raise _Resolved(self)

    monkeypatch.setattr(cfg.Config, "check", caught)
    arguments = {name: VALUES[name]}
    app = arguments.pop("app", "main:app")
    with pytest.raises(_Resolved) as exc:
        cadeloop.serve(app, **arguments)
    config = exc.value.args[0]
    monkeypatch.undo()
    config.check()  # the real check, now that serve() is left
    assert_arrives(config, name)


# --------------------------------------------------------------------------- every setting at once, through the CLI


def print_config(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, tuple[str, str]]:
    """`cadeloop --print-config ARGS`: each setting's value as TOML and where it came from."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(cfg.ENV_PREFIX)}
    p = subprocess.run([sys.executable, "-m", "cadeloop", "--print-config", *args], capture_output=True, text=True,
                       env={**base, **env}, cwd=cwd, timeout=60)
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        left, _, origin = line.partition("  # ")
        key, _, value = left.partition(" = ")
        out[key] = (value.strip(), origin)
    return out


def expected(name: str) -> str:
    return _core.format_setting(name, VALUES[name], toml=True)


@pytest.mark.parametrize("group", GROUPS, ids=["uds", "fd"])
def test_the_command_line_reads_every_source(group: list[str], tmp_path: Path) -> None:
    rest = [n for n in group if n != "app"]
    flags = [part for n in rest for part in flag(n) if part]
    shown = print_config([VALUES["app"], *flags], {}, tmp_path)
    for name in group:
        origin = "argument APP" if name == "app" else f"flag {flag(name)[0]}"
        assert shown[name] == (expected(name), origin), name

    shown = print_config([], {env_name(n): text(n) for n in group}, tmp_path)
    for name in group:
        assert shown[name] == (expected(name), f"env {env_name(name)}"), name

    path = tmp_path / "cadeloop.toml"
    path.write_text("".join(toml_line(n) for n in group))
    shown = print_config(["--config", str(path)], {}, tmp_path)
    for line, name in enumerate(group, start=1):
        assert shown[name] == (expected(name), f"{path}:{line}"), name
