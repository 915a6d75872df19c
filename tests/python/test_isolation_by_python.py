"""`--isolation auto` on each CPython: what it chooses, and that two pairs then serve and stop cleanly.

Part of the 3.12 smoke stage of scripts/test (with test_smoke.py and
test_server_asgi.py): 3.12 has own-GIL sub-interpreters, but 3.12.1 aborts
the process in common cases, so auto must give processes there, with one line
naming the cause, and never try a sub-interpreter (not even the probe).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from server_harness import ServerProcess

if sys.version_info >= (3, 13):
    EXPECTED = ("subinterpreters", "auto: the app imports in an own-GIL sub-interpreter")
elif sys.version_info >= (3, 12):
    EXPECTED = ("processes", "own-GIL sub-interpreters are not used on CPython 3.12 (3.12.1 aborts the process")
else:
    EXPECTED = ("processes", f"CPython 3.{sys.version_info[1]} has no own-GIL sub-interpreters")


def test_auto_isolation_for_this_python_serves_on_two_pairs(tmp_path: Path) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", tmp=tmp_path).start()
    try:
        log = srv.log()
        mode, why = EXPECTED
        assert f"isolation {mode} ({why}" in log, log
        assert f"(2 core pairs, isolation {mode}, pid {srv.pid})" in log, log
        pairs = set()
        for _ in range(200):
            with httpx.Client(timeout=10) as client:
                r = client.get(srv.url + "/pair", headers={"connection": "close"})
            assert r.status_code == 200
            pairs.add(r.json()["pair"])
            if len(pairs) == 2:
                break
        assert pairs == {0, 1}
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()
    assert "Fatal Python error" not in srv.log()


def test_subinterpreters_asked_for_on_this_python(tmp_path: Path) -> None:
    """`--isolation subinterpreters` is honoured on 3.13+; on 3.12 and 3.11 processes serve, saying why."""
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", "subinterpreters", tmp=tmp_path).start()
    try:
        log = srv.log()
        if sys.version_info >= (3, 13):
            assert "isolation subinterpreters (asked for)" in log, log
        elif sys.version_info >= (3, 12):
            assert "isolation processes (own-GIL sub-interpreters are not used on CPython 3.12" in log, log
        else:
            assert "isolation processes (--isolation subinterpreters: CPython 3.11 has no own-GIL" in log, log
        with httpx.Client(timeout=10) as client:
            assert client.get(srv.url + "/pair").status_code == 200
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()
