"""Every server setting, from the one table in C++ (config/, exposed by cadeloop._core).

Precedence, lowest first: the table's defaults < a TOML file < `CADELOOP_*`
environment variables < command-line flags < `serve()` / `Config()`
arguments. A bad value from any source raises `SettingError` (a ValueError)
whose text is one line naming where it came from:

    cadeloop.toml:12: max_body: expected a size like "16MiB", got -1
    CADELOOP_MAX_BODY: expected a size like "16MiB", got "abc"
    --max-pipelined: max_pipelined: must be between 1 and 1024, got 5000

`resolve()` is what the command line and `serve()` both use. Nothing here
imports the app or binds a socket.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping

from . import _core

__all__ = [
    "Config", "Resolved", "SettingError", "SETTINGS", "ENV_PREFIX", "resolve", "format_config", "reference", "stub",
]

SettingError = _core.SettingError

#: Every setting's row of the table (name, kind, default, min, max, nullable,
#: choices, unit, section, doc, flag), by name, in the reference's order.
SETTINGS: dict[str, dict[str, Any]] = {row["name"]: row for row in _core.settings_table()}

#: The default prefix of the environment variables; CADELOOP_CONFIG names a TOML file.
ENV_PREFIX = "CADELOOP_"
CONFIG_VARIABLE = "CONFIG"
#: uvicorn's variable for forwarded_allow_ips, read when no other source sets it.
UVICORN_TRUST_VARIABLE = "FORWARDED_ALLOW_IPS"

_FIELD_TYPES: dict[str, Any] = {
    "int": int, "size": int, "duration": float, "float": float, "bool": bool, "str": str, "choice": str,
}


def _field(row: dict[str, Any]) -> tuple[str, Any, Any]:
    """One dataclass field from one row of the table: its name, type and default."""
    if row["name"] == "app":
        kind: Any = Any  # a "module:attribute" string, or an ASGI app object given to serve()
    else:
        kind = _FIELD_TYPES[row["kind"]]
        if row["nullable"]:
            kind = kind | None
    return row["name"], kind, dataclasses.field(default=row["default"])


def _header_lines(value: Any) -> str:
    """The `headers` setting as "Name: value" lines from "Name:Value" text or (name, value) pairs.

    Raises SettingError for a line without a colon, a name that is not an
    HTTP token, or a value with a control character.
    """
    if isinstance(value, str):
        items: list[Any] = [line for line in value.splitlines() if line.strip()]
    else:
        items = list(value)
    out = []
    for item in items:
        if isinstance(item, str):
            name, colon, text = item.partition(":")
            if not colon:
                raise SettingError(f"headers: expected NAME:VALUE, got {item!r}")
        else:
            name, text = item
            name = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            text = text.decode("latin-1") if isinstance(text, bytes) else str(text)
        name, text = name.strip(), text.strip()
        if not name or any(c in "()<>@,;:\\\"/[]?={} \t" or not 32 < ord(c) < 127 for c in name):
            raise SettingError(f"headers: {name!r} is not a header name")
        if any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in text):
            raise SettingError(f"headers: the value of {name} has a control character")
        out.append(f"{name}: {text}")
    return "\n".join(out)


def _check_forwarded(value: Any) -> str:
    """forwarded_allow_ips as one comma list (a list of entries is joined); SettingError for a bad entry."""
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    problem = _core.check_forwarded_allow_ips(text)
    if problem:
        raise SettingError(f"forwarded_allow_ips: {problem}")
    return text


class _ConfigMethods:
    """What Config does besides holding the table's values (its fields come from the table)."""

    def __post_init__(self) -> None:
        self.check()

    def _normalise(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "app" and value is not None and not isinstance(value, str):
                continue  # an ASGI app object given to serve()
            if f.name == "headers":
                value = _header_lines(value)  # also [(name, value), ...] as uvicorn's Config takes
            elif f.name == "forwarded_allow_ips":
                value = _check_forwarded(value)  # also a list, as uvicorn's Config takes
            setattr(self, f.name, _core.check_setting(f.name, value))

    def check(self) -> None:
        """Checks every value again (fields may have been assigned since) and the settings that go together."""
        self._normalise()
        if getattr(self, "uds") is not None and getattr(self, "fd") is not None:
            raise SettingError("uds and fd cannot both be given")
        problem = _core.check_access_log_format(getattr(self, "access_log_format"))
        if problem:
            raise SettingError(problem if problem.startswith("access_log_format") else f"access_log_format: {problem}")

    def table_values(self) -> dict[str, Any]:
        """Every setting's value by name, in table order (an ASGI app object as `app` is shown as None)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        if out["app"] is not None and not isinstance(out["app"], str):
            out["app"] = None
        return out

    def core_options(self) -> dict[str, Any]:
        """The dict cadeloop._core.ServerCore reads: every setting by name, checked again by the table.

        A removed limit (max_body=None) is written as the core's one "no limit" number.
        """
        return _core.core_options(self.table_values())

    def scheme(self) -> str:
        """"https" with TLS on (ssl_certfile given), else "http": what the "listening on" lines show."""
        return "https" if getattr(self, "ssl_certfile") else "http"

    def describe_listen(self) -> str:
        uds, fd = getattr(self, "uds"), getattr(self, "fd")
        if uds is not None:
            return f"unix:{uds}"
        if fd is not None:
            return f"fd {fd}"
        host = getattr(self, "host")
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{getattr(self, 'port')}"

    @classmethod
    def from_env(cls, prefix: str = ENV_PREFIX, environ: Mapping[str, str] | None = None) -> Any:
        """Defaults overridden by the `<prefix><NAME>` environment variables (not the file they may name)."""
        return resolve(environ=os.environ if environ is None else environ, prefix=prefix, use_config_variable=False).config

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Any:
        """Defaults overridden by the TOML file at `path`."""
        return resolve(file=path).config


#: Every server setting: one field per row of the table, in table order, with
#: the table's default. `Config(**settings)` checks and normalises each value
#: through the table ("16MiB" -> 16777216, "500ms" -> 0.5) and raises
#: SettingError with one line. `app` may also be an ASGI app object (serve()).
Config = dataclasses.make_dataclass(
    "Config",
    [_field(row) for row in SETTINGS.values()],
    bases=(_ConfigMethods,),
    namespace={"__module__": __name__, "__doc__": "Every server setting; the fields are the table's rows.\n\n"
               "`Config(**settings)` checks and normalises each value through the table (\"16MiB\" -> "
               "16777216, \"500ms\" -> 0.5) and raises SettingError with one line. `app` may also be an "
               "ASGI app object (serve())."},
)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A resolved Config and, per setting, where its value came from.

    Origins read "default", "cadeloop.toml:12", "env CADELOOP_MAX_BODY",
    "flag --max-body", or the arguments' origin ("serve()", "argument APP").
    """

    config: Config
    origins: dict[str, str]
    file: str | None = None


def resolve(
    *,
    file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prefix: str = ENV_PREFIX,
    flags: Iterable[tuple[str, str]] = (),
    arguments: Mapping[str, Any] | None = None,
    arguments_origin: str = "serve()",
    use_config_variable: bool = True,
) -> Resolved:
    """Every setting by precedence: defaults < `file` < `environ` < `flags` < `arguments`.

    `file` is a TOML file; when it is None and `use_config_variable` is set,
    `<prefix>CONFIG` in `environ` names it. `environ` is read for variables
    starting with `prefix` (None: no environment layer). `flags` are
    ("--max-body", "16MiB") pairs as typed on the command line; a boolean
    flag has the text "" ("--access-log") and its negation ("--no-access-log")
    too. `arguments` are keyword values (serve(), Config()); an ASGI app object
    as `app` is kept as it is. Raises SettingError (one line).
    """
    if file is None and use_config_variable and environ is not None:
        file = environ.get(prefix + CONFIG_VARIABLE) or None
    args = dict(arguments or {})
    app_object = None
    if "app" in args and args["app"] is not None and not isinstance(args["app"], str):
        app_object = args.pop("app")
    rows = _core.resolve_settings(
        file=None if file is None else os.fspath(file),
        environ=None if environ is None else dict(environ),
        prefix=prefix,
        flags=list(flags),
        arguments=args,
        arguments_origin=arguments_origin,
    )
    values = {name: value for name, value, _ in rows}
    origins = {name: origin for name, _, origin in rows}
    if app_object is not None:
        values["app"] = app_object
        origins["app"] = arguments_origin
    if environ is not None and origins["forwarded_allow_ips"] == "default" and UVICORN_TRUST_VARIABLE in environ:
        # uvicorn's variable, read when no other source set the list (as uvicorn reads it).
        values["forwarded_allow_ips"] = environ[UVICORN_TRUST_VARIABLE]
        origins["forwarded_allow_ips"] = f"env {UVICORN_TRUST_VARIABLE}"
    try:
        config = Config(**values)
    except SettingError as exc:
        # Checks made by Config (forwarded_allow_ips, headers, ...) name the setting; add where it came from.
        name = str(exc).partition(":")[0]
        origin = origins.get(name, "default")
        if origin == "default":
            raise
        where = origin.partition(" ")[2] if origin.startswith(("flag ", "env ")) else origin
        raise SettingError(f"{where}: {exc}") from None
    return Resolved(config, origins, None if file is None else os.fspath(file))


def format_config(resolved: Resolved) -> str:
    """`--print-config`: every setting as a TOML line with where its value came from (valid TOML)."""
    lines = []
    for name in SETTINGS:
        value = getattr(resolved.config, name)
        if name == "app" and value is not None and not isinstance(value, str):
            text = repr(f"{type(value).__module__}.{type(value).__qualname__} object")
        else:
            text = _core.format_setting(name, value, toml=True)
        lines.append((f"{name} = {text}", resolved.origins[name]))
    width = max(len(left) for left, _ in lines)
    return "".join(f"{left.ljust(width)}  # {origin}\n" for left, origin in lines)


# --------------------------------------------------------------------------- the reference

_KIND_TEXT = {
    "int": "integer",
    "size": "size",
    "duration": "duration",
    "float": "number",
    "bool": "boolean",
    "str": "string",
    "choice": "one of",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """docs/configuration.md, generated from the table (`python -m cadeloop --print-reference`)."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated from the settings table in config/include/cadeloop/config/table.def by",
        "     `python -m cadeloop --print-reference > docs/configuration.md`",
        "     (or scripts/gen-config-doc). Do not edit by hand. -->",
        "",
        "Every setting is declared once, in `config/include/cadeloop/config/table.def`, and reaches cadeloop",
        "from any of these sources; a later source overrides an earlier one:",
        "",
        "1. the default below;",
        "2. a TOML file: `--config FILE`, or the file `CADELOOP_CONFIG` names;",
        "3. an environment variable `CADELOOP_<NAME>` (`CADELOOP_MAX_BODY=16MiB`);",
        "4. a command-line flag (`--max-body 16MiB`; `--access-log` / `--no-access-log` for booleans);",
        "5. a keyword argument of `cadeloop.serve()` or `cadeloop.config.Config()` (`max_body=\"16MiB\"`).",
        "",
        "`cadeloop APP --print-config` prints every resolved setting, its value and",
        "where that value came from, then exits.",
        "",
        "A bad value or an unknown name from any source stops start-up before the",
        "app is imported and before anything binds, with one line naming the",
        "source and exit code 2:",
        "",
        "```text",
        "cadeloop: cadeloop.toml:12: max_body: expected a size like \"16MiB\", got -1",
        "cadeloop: CADELOOP_MAX_BODY: expected a size like \"16MiB\", got \"abc\"",
        "cadeloop: --max-pipelined: max_pipelined: must be between 1 and 1024, got 5000",
        "cadeloop: cadeloop.toml:3: unknown setting \"max_bdy\" (did you mean \"max_body\"?)",
        "```",
        "",
        "`serve()` raises the same line as `cadeloop.config.SettingError` (a",
        "`ValueError`), or `TypeError` for an unknown keyword.",
        "",
        "## Values",
        "",
        "- **size**: bytes, as `16MiB`, `64KiB`, `1GiB`, `1.5GiB` (powers of 1024),",
        "  `10MB`, `1kB` (powers of 1000), or a bare number of bytes (`512`). In",
        "  TOML: an integer (bytes) or a string with a unit.",
        "- **duration**: seconds, as `30s`, `500ms`, `250us`, `2m`, `1h`, or a bare",
        "  number of seconds (`1.5`). In TOML: a number (seconds) or a string with a unit.",
        "- **boolean**: `true`/`false` (also `yes`/`no`, `on`/`off`, `1`/`0` in",
        "  variables). In TOML: `true` or `false`.",
        "- **integer**, **string**, **one of**: as written; in TOML an integer or a string.",
        "- **none**: settings marked *none allowed* take the word `none` (in TOML",
        "  the string `\"none\"`, in Python `None`) to remove a limit or leave a path unset.",
        "",
        "A TOML file holds settings as top-level keys, the app included:",
        "",
        "```toml",
        "app = \"main:app\"",
        "port = 8080",
        "max_body = \"16MiB\"",
        "keepalive_idle = \"30s\"",
        "access_log = true",
        "```",
        "",
        "Variables that start with `CADELOOP_` and are not settings are refused, except:",
        "",
    ]
    explain = {
        "CONFIG": "the TOML file to read when `--config` is not given",
        "FUZZ_SECONDS": "seconds per fuzz target in `scripts/test` (not read by the server)",
        "FUZZ_JOBS": "parallel fuzz targets in `scripts/fuzz` (not read by the server)",
    }
    for name in _core.environment_names_not_settings():
        out.append(f"- `{ENV_PREFIX}{name}`: {explain.get(name, 'not a setting')}")
    section = None
    for name, row in SETTINGS.items():
        if row["section"] != section:
            section = row["section"]
            out += ["", f"## {section}", "", "| Setting | Kind | Default | Range | Description |",
                    "|---|---|---|---|---|"]
        kind = _KIND_TEXT[row["kind"]]
        if row["choices"]:
            kind += " " + ", ".join(f"`{c}`" for c in row["choices"])
        if row["unit"]:
            kind += f" ({row['unit']})"
        if row["nullable"]:
            kind += f"; none allowed: {row['none_means']}"
        default = row["default_text"]
        default_cell = f"`{default}`" if default else '`""`'
        bounds = f"{row['min_text']} .. {row['max_text']}" if row["min_text"] is not None else ""
        env = ENV_PREFIX + name.upper()
        flag = "`APP` (argument)" if name == "app" else f"`{row['flag']}`"
        names = f"`{name}`<br>{flag}<br>`{env}`"
        out.append(f"| {names} | {_cell(kind)} | {_cell(default_cell)} | {bounds} | {_cell(row['doc'])} |")
    out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- the typing stub

_STUB_TYPES = {"int": "int", "size": "int | str", "duration": "float | str", "float": "float", "bool": "bool",
               "str": "str", "choice": "str"}


def stub() -> str:
    """pyhost/cadeloop/config.pyi, generated from the table so editors see every setting of Config."""
    fields = []
    params = []
    for name, row in SETTINGS.items():
        if name == "app":
            kind = "Any"
        elif name == "headers":
            kind = "str | Sequence[tuple[str | bytes, str | bytes]]"
        elif name == "forwarded_allow_ips":
            kind = "str | Sequence[str]"
        else:
            kind = _STUB_TYPES[row["kind"]] + (" | None" if row["nullable"] else "")
        default = "None" if row["default"] is None else repr(row["default"])
        fields.append(f"    {name}: {kind}  # {row['doc']}")
        params.append(f"        {name}: {kind} = {default},")
    return "\n".join([
        "# Generated from the settings table by cadeloop.config.stub() (scripts/gen-config-doc). Do not edit.",
        "import dataclasses",
        "import os",
        "from typing import Any, Iterable, Mapping, Sequence",
        "",
        "from . import _core",
        "",
        "__all__: list[str]",
        "SettingError = _core.SettingError",
        "SETTINGS: dict[str, dict[str, Any]]",
        "ENV_PREFIX: str",
        "CONFIG_VARIABLE: str",
        "UVICORN_TRUST_VARIABLE: str",
        "",
        "class Config:",
        '    """Every server setting; the fields are the table\'s rows (docs/configuration.md)."""',
        *fields,
        "    def __init__(",
        "        self,",
        *params,
        "    ) -> None: ...",
        "    def check(self) -> None: ...",
        "    def table_values(self) -> dict[str, Any]: ...",
        "    def core_options(self) -> dict[str, Any]: ...",
        "    def scheme(self) -> str: ...",
        "    def describe_listen(self) -> str: ...",
        "    @classmethod",
        "    def from_env(cls, prefix: str = ..., environ: Mapping[str, str] | None = ...) -> Config: ...",
        "    @classmethod",
        "    def from_toml(cls, path: str | os.PathLike[str]) -> Config: ...",
        "",
        "@dataclasses.dataclass(frozen=True)",
        "class Resolved:",
        "    config: Config",
        "    origins: dict[str, str]",
        "    file: str | None = ...",
        "",
        "def resolve(",
        "    *,",
        "    file: str | os.PathLike[str] | None = ...,",
        "    environ: Mapping[str, str] | None = ...,",
        "    prefix: str = ...,",
        "    flags: Iterable[tuple[str, str]] = ...,",
        "    arguments: Mapping[str, Any] | None = ...,",
        "    arguments_origin: str = ...,",
        "    use_config_variable: bool = ...,",
        ") -> Resolved: ...",
        "def format_config(resolved: Resolved) -> str: ...",
        "def reference() -> str: ...",
        "def stub() -> str: ...",
        "",
    ])
