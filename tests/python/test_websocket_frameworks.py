"""FastAPI and Starlette WebSocket endpoints served by a real cadeloop server, with the `websockets` client.

server_apps/ws_frameworks_app.py holds the endpoints; disconnects the app saw
come back through the WS_EVENTS file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from server_harness import ServerProcess

pytestmark = pytest.mark.timeout(60)


def events_of(path: Path, route: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            found = [json.loads(x) for x in path.read_text().splitlines() if x]
            found = [e for e in found if e.get("path") == route]
            if found:
                return found
        time.sleep(0.02)
    raise AssertionError(f"no event for {route}")


@pytest.fixture(scope="module")
def fastapi_server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("fastapi")
    events = tmp / "events.jsonl"
    # One pair: the broadcast room is one pair's set of connections.
    srv = ServerProcess("ws_frameworks_app:fastapi_app", "--cores", "1", tmp=tmp,
                        env={"WS_EVENTS": str(events)}).start()
    yield srv, events
    assert srv.stop() == 0, srv.log()


def url(srv: ServerProcess, path: str) -> str:
    return f"ws://127.0.0.1:{srv.port}{path}"


def test_fastapi_receive_text_and_disconnect(fastapi_server) -> None:
    srv, events = fastapi_server
    with connect(url(srv, "/ws/echo")) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "echo: hello"
        ws.close(1001)
    assert events_of(events, "/ws/echo")[-1]["code"] == 1001


def test_fastapi_iter_text(fastapi_server) -> None:
    srv, events = fastapi_server
    with connect(url(srv, "/ws/iter")) as ws:
        for word in ("a", "bc", "déf"):
            ws.send(word)
            assert ws.recv(timeout=10) == word.upper()
    assert events_of(events, "/ws/iter")[-1]["ended"] is True


def test_fastapi_broadcast_between_two_connections(fastapi_server) -> None:
    srv, _ = fastapi_server
    with connect(url(srv, "/ws/room")) as a:
        assert json.loads(a.recv(timeout=10)) == {"members": 1}
        with connect(url(srv, "/ws/room")) as b:
            assert json.loads(b.recv(timeout=10)) == {"members": 2}
            a.send("from a")
            assert b.recv(timeout=10) == "from a"
            assert a.recv(timeout=10) == "from a"
            b.send("from b")
            assert a.recv(timeout=10) == "from b"
            assert b.recv(timeout=10) == "from b"


def test_fastapi_subprotocols(fastapi_server) -> None:
    srv, _ = fastapi_server
    with connect(url(srv, "/ws/sub"), subprotocols=["v1", "v2"]) as ws:
        assert ws.subprotocol == "v2"
        assert json.loads(ws.recv(timeout=10)) == ["v1", "v2"]
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1000


def test_fastapi_denial_is_403(fastapi_server) -> None:
    srv, _ = fastapi_server
    with pytest.raises(InvalidStatus) as info:
        connect(url(srv, "/ws/deny"))
    assert info.value.response.status_code == 403


def test_fastapi_http_route_beside_websockets(fastapi_server) -> None:
    import httpx

    srv, _ = fastapi_server
    assert httpx.get(srv.url + "/").json() == {"ok": True}


def test_starlette_websocket_endpoint(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    srv = ServerProcess("ws_frameworks_app:starlette_app", "--cores", "2", tmp=tmp_path,
                        env={"WS_EVENTS": str(events)}).start()
    try:
        for _ in range(4):  # connections land on both pairs
            with connect(url(srv, "/ws/endpoint")) as ws:
                ws.send("hi")
                assert ws.recv(timeout=10) == "starlette: hi"
        assert events_of(events, "/ws/endpoint")[-1]["code"] == 1000
    finally:
        assert srv.stop() == 0, srv.log()
