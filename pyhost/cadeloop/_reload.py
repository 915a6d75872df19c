"""`--reload` (development): run the server as a child process and restart it when a watched file changes.

The process the user started only watches: it polls the watched
directories every 0.25 s (file modification times; no dependency, no
inotify), and runs the real server as `python -m cadeloop ...` with the same
command line and `CADELOOP_RELOAD=false`. On a change it stops the child
with SIGTERM (requests in flight finish within `grace`), waits for it, and
starts a new one; a server that exited by itself (an error in the edited
file) is started again on the next change. SIGINT/SIGTERM stop the child and then the watcher, which
exits with the child's code. One pair only: a reload restarts the whole
server, and with more pairs that would hide what a restart costs in
production, so `--reload` with `--cores` other than 1 is refused at start.

Watched: every file under `reload_dirs` (default: `app_dir`, else the
current directory) whose name matches a `reload_include` pattern (default
`*.py`) and no `reload_exclude` pattern; a directory whose name matches a
`reload_exclude` pattern is not entered (`.git`, `.venv`, ...).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ._log import logger

__all__ = ["POLL_SECONDS", "patterns", "watched_files", "run_with_reload"]

POLL_SECONDS = 0.25


def patterns(text: str) -> list[str]:
    """A setting's patterns or directories: comma- or line-separated, blanks dropped."""
    return [p.strip() for p in text.replace("\n", ",").split(",") if p.strip()]


def _excluded(name: str, exclude: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in exclude)


def watched_files(dirs: Sequence[str], include: Sequence[str], exclude: Sequence[str]) -> dict[str, float]:
    """path -> modification time of every watched file now."""
    found: dict[str, float] = {}
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if not _excluded(d, exclude)]
            for name in files:
                if _excluded(name, exclude) or not any(fnmatch.fnmatch(name, p) for p in include):
                    continue
                path = os.path.join(root, name)
                try:
                    found[path] = os.stat(path).st_mtime_ns
                except OSError:
                    pass  # gone between the listing and the stat
    return found


def _changed(before: dict[str, float], now: dict[str, float]) -> str | None:
    for path, mtime in now.items():
        if before.get(path) != mtime:
            return path
    for path in before:
        if path not in now:
            return path
    return None


def run_with_reload(argv: Sequence[str], config: Any) -> int:
    """Serves `cadeloop ARGV` in a child process, restarted on every change. Returns the exit code."""
    dirs = patterns(config.reload_dirs) or [config.app_dir or os.getcwd()]
    for d in dirs:
        if not Path(d).is_dir():
            logger.error("--reload-dir: %r is not a directory", d)
            return 2
    include = patterns(config.reload_include)
    exclude = patterns(config.reload_exclude)
    child_argv = [sys.executable, "-m", "cadeloop", *(a for a in argv if a != "--reload")]
    env = dict(os.environ, CADELOOP_RELOAD="false")
    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    logger.info("reload: watching %s (%s; not %s)", ", ".join(os.path.abspath(d) for d in dirs),
                ", ".join(include), ", ".join(exclude))
    try:
        while True:
            files = watched_files(dirs, include, exclude)
            child = subprocess.Popen(child_argv, env=env)
            changed = None
            said = False
            while not stopping and changed is None:
                time.sleep(POLL_SECONDS)
                if child.poll() is not None and not said:
                    # It ended by itself (its own line said why): wait for a fix, as uvicorn does.
                    logger.info("reload: the server exited with code %d; waiting for a change", child.returncode)
                    said = True
                now = watched_files(dirs, include, exclude)
                changed = _changed(files, now)
            if stopping:
                if child.poll() is None:
                    child.send_signal(stopping[0])
                return child.wait()
            logger.info("reload: %s changed; restarting the server", changed)
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
