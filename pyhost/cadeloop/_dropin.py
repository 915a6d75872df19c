"""What a uvicorn command line needs besides the settings: --env-file and --log-config.

`load_env_file()` reads KEY=VALUE lines (python-dotenv's simple syntax,
without the dependency) into the environment; `apply_log_config()` reads a
logging configuration file the way uvicorn does (.json and .yaml/.yml through
dictConfig, anything else through fileConfig). Both run before the app is
imported; a bad file is one SettingError line naming the setting.
"""

from __future__ import annotations

import json
import logging.config
import os
from typing import MutableMapping

from .config import SettingError


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        if value[0] == '"':
            inner = inner.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        return inner
    hash_at = value.find(" #")
    return (value[:hash_at] if hash_at >= 0 else value).strip()


def read_env_file(path: str) -> dict[str, str]:
    """The variables of an env file: `KEY=VALUE`, `export KEY=VALUE`, quotes, `#` comments.

    Raises SettingError ("env_file: ...") when the file cannot be read or a
    line is not an assignment.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise SettingError(f"env_file: cannot read {path}: {exc.strerror}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("export "):
            text = text[len("export "):].lstrip()
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq or not key.replace("_", "a").replace(".", "a").isalnum():
            raise SettingError(f"env_file: {path}:{number}: expected KEY=VALUE, got {line.strip()!r}")
        out[key] = _unquote(value)
    return out


def load_env_file(path: str, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Puts the file's variables into `environ` (os.environ) unless already set, as uvicorn does; returns their names."""
    env = os.environ if environ is None else environ
    added = []
    for key, value in read_env_file(path).items():
        if key not in env:
            env[key] = value
            added.append(key)
    return added


def apply_log_config(path: str) -> None:
    """Configures `logging` from `path` as uvicorn reads it: .json or .yaml/.yml by dictConfig, else fileConfig.

    Raises SettingError ("log_config: ...") for a missing file, a YAML file
    without PyYAML installed, or a configuration logging refuses.
    """
    if not os.path.exists(path):
        raise SettingError(f"log_config: no such file: {path}")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                logging.config.dictConfig(json.load(f))
        elif path.endswith((".yaml", ".yml")):
            try:
                import yaml  # type: ignore[import-untyped]  # optional, as in uvicorn
            except ImportError:
                raise SettingError(
                    f"log_config: {path} is YAML, which needs PyYAML (pip install pyyaml); "
                    "or write it as .json or .ini") from None
            with open(path, encoding="utf-8") as f:
                logging.config.dictConfig(yaml.safe_load(f))
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except SettingError:
        raise
    except Exception as exc:  # json, yaml, configparser and logging's own errors
        raise SettingError(f"log_config: {path}: {type(exc).__name__}: {exc}") from None

