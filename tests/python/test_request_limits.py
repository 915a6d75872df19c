"""uvicorn's `--limit-concurrency` (503 beyond it) and `--limit-max-requests` (a pair replaced after N), on real servers."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import httpx
import pytest

from server_harness import ServerProcess

STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")
MODES = ["subinterpreters", "processes"] if sys.version_info >= (3, 13) else ["processes"]


def test_limit_concurrency_answers_503_at_once_beyond_it_and_counts_them(tmp_path: Path) -> None:
    srv = ServerProcess("cores_app:app", "--limit-concurrency", "2", "--stats-port", "0", tmp=tmp_path).start()
    try:
        stats_port = int(srv.wait_log(STATS.pattern).group(1))
        results: list[tuple[int, str]] = []
        lock = threading.Lock()

        def one() -> None:
            with httpx.Client(timeout=20) as client:
                r = client.get(srv.url + "/slow", params={"delay": "1.5"})
            with lock:
                results.append((r.status_code, r.text))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        statuses = sorted(code for code, _ in results)
        assert statuses == [200, 200] + [503] * 6, results
        assert all(text.startswith("Service Unavailable") for code, text in results if code == 503)
        # Past the burst the limit is free again.
        assert httpx.get(srv.url + "/slow", params={"delay": "0"}, timeout=10).status_code == 200
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=10).json()
        assert stats["totals"]["responses"]["5xx"] == 6, stats["totals"]
        assert stats["totals"]["responses"]["2xx"] == 3, stats["totals"]
    finally:
        assert srv.stop() == 0, srv.log()


def never_taken(exc: httpx.HTTPError) -> bool:
    """Whether a request failed before the server took it, so a GET may be sent again (RFC 9112, 9.3.1), as
    browsers and proxies do (counted).

    Closed before any response began: a keep-alive connection the draining pair closed as it was reused. Or the
    same race seen as a reset: the draining pair closed the idle connection with the reused request unread in
    its socket, so the kernel answered RST instead of FIN. Nothing reached the app. Anything else, such as a
    refused connection (no listener on the port), is a failure.
    """
    if isinstance(exc, httpx.RemoteProtocolError):
        return "without sending a response" in str(exc)
    if isinstance(exc, httpx.ReadError):
        return "Connection reset by peer" in str(exc)
    return False


@pytest.mark.parametrize("isolation", MODES)
def test_limit_max_requests_replaces_pairs_under_load_without_a_failed_request(tmp_path: Path,
                                                                                isolation: str) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--limit-max-requests", "25",
                        tmp=tmp_path).start()
    ok = 0
    failures: list[str] = []
    answered: set[str] = set()
    retried: list[str] = []
    lock = threading.Lock()
    try:
        def client_loop() -> None:
            nonlocal ok
            with httpx.Client(timeout=20) as client:
                for _ in range(60):
                    r = None
                    for attempt in range(3):
                        try:
                            r = client.get(srv.url + "/slow", params={"delay": "0.005"})
                            break
                        except httpx.HTTPError as exc:
                            again = never_taken(exc)
                            with lock:
                                if again:
                                    retried.append(str(exc))
                                else:
                                    failures.append(f"{type(exc).__name__}: {exc}")
                            if not again:
                                break
                    if r is None:
                        with lock:
                            failures.append("not answered")
                        continue
                    with lock:
                        if r.status_code == 200 and r.text.startswith("slow done"):
                            ok += 1
                            answered.add(r.text)
                        else:
                            failures.append(f"{r.status_code} {r.text[:80]}")

        threads = [threading.Thread(target=client_loop) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        log = srv.log()
        assert failures == [], failures[:5]
        assert len(retried) <= 12, retried  # a few at most (each replacement closes its idle connections)
        assert ok == 240
        # 240 requests over 2 pairs of 25..27 each: pairs were replaced, more than once.
        assert log.count("served limit_max_requests: replacing it") >= 2, log
        assert "served limit_max_requests (25)" in log
        assert "restarting it" not in log and "giving up" not in log, log
        if isolation == "processes":
            pids = {text.split()[3] for text in answered}
            assert len(pids) > 2, answered  # new worker processes answered
        # Still serving on both pairs after the replacements.
        assert httpx.get(srv.url + "/pair", timeout=10).status_code == 200
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_limit_concurrency_counts_websockets_and_refuses_a_handshake_with_503(tmp_path: Path) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    srv = ServerProcess("ws_app:app", "--limit-concurrency", "1", tmp=tmp_path).start()
    ws_url = f"ws://127.0.0.1:{srv.port}/echo"
    try:
        with connect(ws_url) as held:  # the one slot
            held.send("hi")
            assert held.recv(timeout=10) == "hi"
            with pytest.raises(InvalidStatus) as refused:
                connect(ws_url, open_timeout=10)
            assert refused.value.response.status_code == 503
            assert refused.value.response.body.startswith(b"Service Unavailable")
            assert httpx.get(srv.url + "/plain", timeout=10).status_code == 503
        # The slot is free again once the held websocket closed.
        for _ in range(100):
            try:
                with connect(ws_url, open_timeout=10) as again:
                    again.send("back")
                    assert again.recv(timeout=10) == "back"
                break
            except InvalidStatus:
                threading.Event().wait(0.05)  # the server has not seen the close yet
        else:
            raise AssertionError(srv.log())
    finally:
        assert srv.stop() == 0, srv.log()
