"""The server log as a user sees it: cadeloop's own messages on stderr, their level and their order.

Every message (start, isolation chosen, an app's exception with its
traceback, a pair's lines, the CLI's one-line errors) goes through one native
spdlog logger that writes "cadeloop: <message>" to stderr; `--log-level`
filters it in the main process and in every pair. Each test runs a real
server process (or the real CLI) and reads what it wrote to stderr.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_harness import APPS, ServerProcess

SUBINTERPRETERS = sys.version_info >= (3, 13)
#: The isolation modes this Python can run: sub-interpreter variants exist only on 3.13+, as in
#: test_server_cores.py (on 3.11 they are not defined, not skipped).
MODES = ["subinterpreters", "processes"] if SUBINTERPRETERS else ["processes"]

# An app that says which pair served it, prints to its own stderr on /print and raises on /raise.
LOG_APP = '''
import os
import sys

from cadeloop.server import current_pair


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                if os.environ.get("LOG_APP_FAIL_STARTUP"):
                    await send({"type": "lifespan.startup.failed", "message": "database unreachable"})
                    return
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/raise":
        raise ValueError(f"boom in pair {current_pair()}")
    if scope["path"] == "/print":
        print(f"the app says {scope['query_string'].decode()}", file=sys.stderr)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(current_pair()).encode()})
'''


def log_app(tmp_path: Path) -> Path:
    """A directory holding log_app.py."""
    d = tmp_path / "apps"
    d.mkdir(exist_ok=True)
    (d / "log_app.py").write_text(LOG_APP)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class QuietServer:
    """`cadeloop APP --port P ...` for a level that hides "listening on": ready once it answers HTTP."""

    def __init__(self, app: str, *args: str, tmp: Path, app_dir: Path = APPS) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"quiet-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "cadeloop", app, "--host", "127.0.0.1", "--port",
                                      str(self.port), "--app-dir", str(app_dir), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/", timeout=5)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"server did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        self._log.close()
        return rc


def raise_in_every_pair(srv: ServerProcess | QuietServer, pairs: int) -> None:
    """GET /raise on fresh connections until every pair logged its exception."""
    deadline = time.monotonic() + 20
    with httpx.Client(timeout=10) as client:
        while True:
            assert client.get(srv.url + "/raise", headers={"connection": "close"}).status_code == 500
            text = srv.log()
            if all(f"ValueError: boom in pair {i}\n" in text for i in range(pairs)):
                return
            assert time.monotonic() < deadline, text
            time.sleep(0.01)


def traceback_after(text: str, message: str, exception: str) -> bool:
    """True when `message` is a whole line followed by a traceback that ends with `exception`."""
    pattern = (re.escape(message) + r"\nTraceback \(most recent call last\):\n(?:  .*\n)+?"
               + re.escape(exception) + r"\n")
    return re.search(r"(?:^|\n)" + pattern, text) is not None


def lines_matching(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.fullmatch(pattern, line)]


# --------------------------------------------------------------------------- one pair


def test_default_level_shows_the_start_line_once_and_the_debug_lines_not(tmp_path: Path) -> None:
    srv = ServerProcess("log_app:app", tmp=tmp_path, app_dir=log_app(tmp_path)).start()
    assert srv.stop() == 0
    log = srv.log()
    start = r"cadeloop: listening on http://127\.0\.0\.1:\d+ \(1 core pair, pid \d+\)"
    assert len(lines_matching(log, start)) == 1, log
    assert len(lines_matching(log, r"cadeloop: stopped: 0 requests, 0 responses; .*")) == 1, log
    assert "lifespan startup complete" not in log, log


def test_warning_hides_the_info_lines_and_shows_an_app_exception_with_its_traceback(tmp_path: Path) -> None:
    srv = QuietServer("log_app:app", "--log-level", "warning", tmp=tmp_path, app_dir=log_app(tmp_path))
    try:
        raise_in_every_pair(srv, 1)
    finally:
        assert srv.stop() == 0
    log = srv.log()
    assert traceback_after(log, "cadeloop: Exception in ASGI application", "ValueError: boom in pair 0"), log
    for hidden in ("listening on", "shutting down", "stopped:"):
        assert hidden not in log, log


def test_failed_lifespan_startup_shows_at_warning_and_error(tmp_path: Path) -> None:
    apps = log_app(tmp_path)
    for level in ("warning", "error"):
        p = subprocess.run([sys.executable, "-m", "cadeloop", "log_app:app", "--port", "0", "--app-dir", str(apps),
                            "--log-level", level], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, LOG_APP_FAIL_STARTUP="1"))
        assert p.returncode == 3
        assert p.stderr == "cadeloop: lifespan startup failed: database unreachable\n", (level, p.stderr)


def test_debug_shows_the_debug_lines(tmp_path: Path) -> None:
    srv = ServerProcess("log_app:app", "--log-level", "debug", tmp=tmp_path, app_dir=log_app(tmp_path)).start()
    assert srv.stop() == 0
    log = srv.log()
    assert lines_matching(log, "cadeloop: lifespan startup complete") == ["cadeloop: lifespan startup complete"], log
    assert lines_matching(log, "cadeloop: lifespan shutdown complete") == ["cadeloop: lifespan shutdown complete"], log
    assert len(lines_matching(log, r"cadeloop: listening on .*")) == 1, log


def test_server_lines_and_the_apps_own_stderr_stay_in_order(tmp_path: Path) -> None:
    """The native log writes before returning: its lines interleave with Python's stderr as they happened."""
    srv = ServerProcess("log_app:app", tmp=tmp_path, app_dir=log_app(tmp_path)).start()
    with httpx.Client(timeout=10) as client:
        for i in range(20):
            assert client.get(srv.url + f"/print?{i}").status_code == 200
            assert client.get(srv.url + "/raise").status_code == 500
    assert srv.stop() == 0
    lines = [line for line in srv.log().splitlines()
             if line.startswith(("the app says", "cadeloop: Exception in ASGI", "cadeloop: listening on",
                                 "cadeloop: shutting down", "cadeloop: stopped"))]
    expected = [lines[0]]
    for i in range(20):
        expected += [f"the app says {i}", "cadeloop: Exception in ASGI application"]
    expected += lines[-2:]
    assert lines == expected, srv.log()
    assert lines[0].startswith("cadeloop: listening on ") and lines[-1].startswith("cadeloop: stopped:"), lines


# --------------------------------------------------------------------------- core pairs


@pytest.mark.parametrize("isolation", MODES)
def test_pairs_lines_carry_their_pair_and_the_start_lines_show_once(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("log_app:app", "--cores", "2", "--isolation", isolation, tmp=tmp_path,
                        app_dir=log_app(tmp_path)).start()
    raise_in_every_pair(srv, 2)
    assert srv.stop() == 0
    log = srv.log()
    assert lines_matching(log, r"cadeloop: isolation .*") == [f"cadeloop: isolation {isolation} (asked for)"], log
    assert len(lines_matching(
        log, rf"cadeloop: listening on http://127\.0\.0\.1:{srv.port} \(2 core pairs, isolation {isolation}, pid \d+\)"
    )) == 1, log
    for i in range(2):
        serving = rf"cadeloop: pair {i}: serving on 127\.0\.0\.1:{srv.port} \(pid \d+\)"
        assert len(lines_matching(log, serving)) == 1, log
        assert traceback_after(log, f"cadeloop: pair {i}: Exception in ASGI application",
                               f"ValueError: boom in pair {i}"), (isolation, log)


@pytest.mark.parametrize("isolation", MODES)
def test_warning_applies_in_every_pair(tmp_path: Path, isolation: str) -> None:
    srv = QuietServer("log_app:app", "--cores", "2", "--isolation", isolation, "--log-level", "warning",
                      tmp=tmp_path, app_dir=log_app(tmp_path))
    try:
        raise_in_every_pair(srv, 2)
    finally:
        assert srv.stop() == 0
    log = srv.log()
    for i in range(2):
        assert traceback_after(log, f"cadeloop: pair {i}: Exception in ASGI application",
                               f"ValueError: boom in pair {i}"), (isolation, log)
    for hidden in ("isolation", "listening on", "serving on", "shutting down", "stopped:"):
        assert hidden not in log, (isolation, log)


@pytest.mark.parametrize("isolation", MODES)
def test_debug_applies_in_every_pair(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("log_app:app", "--cores", "2", "--isolation", isolation, "--log-level", "debug",
                        tmp=tmp_path, app_dir=log_app(tmp_path)).start()
    assert srv.stop() == 0
    log = srv.log()
    kind = "worker process" if isolation == "processes" else "sub-interpreter thread"
    for i in range(2):
        # Written in the pair's own interpreter (a sub-interpreter or a worker process).
        assert lines_matching(log, f"cadeloop: pair {i}: lifespan startup complete") != [], (isolation, log)
        assert lines_matching(log, f"cadeloop: pair {i}: lifespan shutdown complete") != [], (isolation, log)
        # Written by the supervisor.
        assert len(lines_matching(log, rf"cadeloop: pair {i} started: {kind} .*")) == 1, (isolation, log)


# --------------------------------------------------------------------------- the CLI and the native log


def test_cli_errors_show_at_every_level_in_the_same_bytes() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cadeloop", *args, "--app-dir", str(APPS)],
                              capture_output=True, text=True, timeout=60)

    for level in ("debug", "error"):
        p = cli("mian:app", "--log-level", level)
        assert (p.returncode, p.stderr) == (2, "cadeloop: cannot import module 'mian' (No module named 'mian')\n")
        p = cli("raw_app:app", "--log-level", level, "--cores", "2", "--uds", "/tmp/x.sock")
        assert p.returncode == 2
        assert p.stderr.startswith("cadeloop: --cores 2: more than one core pair needs a TCP address"), p.stderr
        assert p.stderr.count("\n") == 1, p.stderr
    p = cli("raw_app:app", "stray")
    assert p.returncode == 2
    # argparse's usage (Python's stderr) first, then its error line (the native log).
    assert p.stderr.startswith("usage: cadeloop "), p.stderr
    assert p.stderr.endswith("\ncadeloop: error: unrecognized arguments: stray\n"), p.stderr


def test_the_native_level_filters_what_python_and_cpp_write() -> None:
    code = (
        "import logging, cadeloop._core as c\n"
        "assert c.log_level() == 'info'\n"
        "c.log(logging.DEBUG, 'debug at info')\n"
        "c.log(logging.INFO, 'info at info')\n"
        "c.set_log_level('warning')\n"
        "assert c.log_level() == 'warning'\n"
        "c.log(logging.INFO, 'info at warning')\n"
        "c.log(logging.WARNING, 'warning at warning')\n"
        "c.log(logging.CRITICAL, 'several\\nlines')\n"
        "c.log(logging.ERROR, 'undecodable \\udcff name')\n"
        "try:\n"
        "    c.set_log_level('warn')\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ("cadeloop: info at info\n"
                        "cadeloop: warning at warning\n"
                        "cadeloop: several\nlines\n"
                        "cadeloop: undecodable \\udcff name\n")
    assert p.stdout == "unknown log level 'warn' (debug, info, warning, error, critical)\n"


def test_records_keep_the_bytes_the_logging_formatter_gave_them() -> None:
    """What the handler hands to the native log is what "cadeloop: %(message)s" rendered before it."""
    code = (
        "import logging, sys\n"
        "from cadeloop._log import configure_logging as _configure_logging, error_logger, logger\n"
        "_configure_logging()\n"
        "expected = []\n"
        "class Same(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        expected.append(logging.Formatter('cadeloop: %(message)s').format(record) + '\\n')\n"
        "logger.addHandler(Same())\n"
        "logger.info('listening on %s (%d core pair)', 'http://127.0.0.1:8000', 1)\n"
        "logger.debug('hidden at info')\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError as exc:\n"
        "    error_logger.error('Exception in ASGI application', exc_info=exc)\n"
        "error_logger.error('', exc_info=ValueError('empty message'))\n"
        "logger.warning('with the stack', stack_info=True)\n"
        "logger.info('50%% and a surrogate \\udcff')\n"
        "sys.stdout.write(''.join(expected).encode('utf-8', 'backslashreplace').decode())\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Traceback (most recent call last):" in p.stdout and "Stack (most recent call last):" in p.stdout
    assert p.stderr == p.stdout
