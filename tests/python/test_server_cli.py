"""The `cadeloop APP` command: start-up errors as one line, lifespan, graceful shutdown."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_harness import APPS, ServerProcess, SlowLoad, wait_listening


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cadeloop", *args, "--app-dir", str(APPS)],
                          capture_output=True, text=True, timeout=timeout)


def test_module_typo_is_one_line() -> None:
    p = run_cli("mian:app")
    assert p.returncode == 2
    assert p.stderr == "cadeloop: cannot import module 'mian' (No module named 'mian')\n"


def test_attribute_typo_is_one_line() -> None:
    p = run_cli("raw_app:ap")
    assert p.returncode == 2
    assert p.stderr == "cadeloop: module 'raw_app' has no attribute 'ap'\n"


def test_exception_while_importing_shows_its_traceback() -> None:
    p = run_cli("import_error_app:app")
    assert p.returncode == 1
    assert "Traceback (most recent call last)" in p.stderr
    assert "RuntimeError: broken at import time" in p.stderr


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = run_cli("raw_app:app", "--port", str(port))
    assert p.returncode == 1
    assert p.stderr == f"cadeloop: cannot listen on 127.0.0.1:{port}: address already in use\n"


def test_failed_lifespan_startup_exits_non_zero_with_the_apps_message() -> None:
    p = run_cli("failing_startup_app:app", "--port", "0")
    assert p.returncode == 3
    assert "cadeloop: lifespan startup failed: database unreachable" in p.stderr


def test_app_without_lifespan_is_served_in_auto_but_not_in_on(tmp_path: Path) -> None:
    srv = ServerProcess("no_lifespan_app:app", tmp=tmp_path).start()
    try:
        assert httpx.get(srv.url + "/").text == "no lifespan here"
        assert "does not support the ASGI lifespan protocol" in srv.log()
    finally:
        assert srv.stop() == 0
    p = run_cli("no_lifespan_app:app", "--port", "0", "--lifespan", "on")
    assert p.returncode == 3
    assert "lifespan startup raised RuntimeError: unsupported scope lifespan" in p.stderr


def test_serve_api(tmp_path: Path) -> None:
    code = (
        "import cadeloop, sys\n"
        f"sys.path.insert(0, {str(APPS)!r})\n"
        "import raw_app\n"
        "cadeloop.serve(raw_app.app, '127.0.0.1', 0, grace=2.0)\n"
    )
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
        try:
            port = wait_listening(proc, log)
            assert httpx.get(f"http://127.0.0.1:{port}/hello").text == "Hello, World!"
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 0, log.read_text()


def test_sigterm_under_load_loses_no_accepted_request(tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    srv = ServerProcess("raw_app:app", "--grace", "10", "--stats-json-on-exit", str(stats_file), tmp=tmp_path).start()
    load = SlowLoad(srv.port).start()
    time.sleep(1.0)
    rc = srv.stop(signal.SIGTERM)
    load.stop()
    log = srv.log()
    assert rc == 0, log
    assert "raw_app: lifespan shutdown ran" in log
    stats = json.loads(stats_file.read_text())
    assert load.truncated == 0
    assert set(load.bodies) == {b"slow done"}
    complete = len(load.bodies)
    assert complete > 50
    # Every request the server took got its whole response, and the clients read them all.
    assert stats["requests"] == stats["responses"] == complete, (stats, complete)
