"""What a request's scope shares with other requests' is only what nobody can change.

The bridge reuses immutable pieces between requests of one core pair (the (name, value) tuple of
a header whose value repeats, the str and bytes of a path seen just before, the client's host
str): a real `--cores 1` server (one bridge, so every request meets the pieces the previous one
left) and raw sockets check that each request and WebSocket still sees exactly what its client
sent, whatever the app did to the scope of the one before, and whichever value changed.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import pytest

from server_harness import ServerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess("scope_sharing_app:app", "--cores", "1", tmp=tmp_path_factory.mktemp("scope")).start()
    yield srv
    assert srv.stop() == 0, srv.log()


def recv_until(s: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed early: {data!r}"
        data += chunk
    return data


def ws_scope(port: int, path: str, fields: list[tuple[str, str]]) -> dict:
    """The scope the app reported on a WebSocket opened with exactly `fields` (in this order)."""
    key = base64.b64encode(os.urandom(16)).decode()
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    head += f"Sec-WebSocket-Key: {key}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        data = recv_until(s, b"\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 101"), data
        data = data.split(b"\r\n\r\n", 1)[1]
        while len(data) < 2 or len(data) < 2 + (data[1] & 0x7F if data[1] & 0x7F < 126 else 2):
            data += s.recv(65536)
        size = data[1] & 0x7F
        start = 2
        if size == 126:
            size, start = int.from_bytes(data[2:4], "big"), 4
        while len(data) < start + size:
            data += s.recv(65536)
        assert data[0] == 0x81, data[:2]  # one unfragmented text frame
        return json.loads(data[start:start + size]) | {"key": key}


def http_scope(port: int, path: str, fields: list[tuple[str, str]]) -> dict:
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_bytes, body = data.split(b"\r\n\r\n", 1)
    assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
    return json.loads(body)


def ws_fields(host: str, agent: str) -> list[tuple[str, str]]:
    return [("Host", host), ("User-Agent", agent), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
            ("Sec-WebSocket-Version", "13")]


def test_websockets_see_their_own_headers_and_path(server: ServerProcess) -> None:
    # The same values twice (shared pieces), then each value changed, then the first ones again.
    cases = [("/ws/a", "one.example", "agent/1"), ("/ws/a", "one.example", "agent/1"),
             ("/ws/b", "two.example", "agent/1"), ("/ws/a", "one.example", "agent/2"),
             ("/ws/a%20b", "one.example", "agent/2"), ("/ws/a%20b", "one.example", "agent/2"),
             ("/ws/a", "one.example", "agent/1")]
    for path, host, agent in cases:
        seen = ws_scope(server.port, path, ws_fields(host, agent))
        expected = [[k.lower(), v] for k, v in ws_fields(host, agent)] + [["sec-websocket-key", seen["key"]]]
        assert seen["headers"] == expected, (path, host, agent, seen)
        assert seen["raw_path"] == path
        assert seen["path"] == path.replace("%20", " ")
        assert seen["client"][0] == "127.0.0.1" and seen["client"][1] > 0
        assert seen["subprotocols"] == []


def test_http_requests_see_their_own_headers_and_path(server: ServerProcess) -> None:
    cases = [("/p", "one.example", "*/*"), ("/p", "one.example", "*/*"), ("/q", "one.example", "text/html"),
             ("/p%2Fx", "two.example", "*/*"), ("/p%2Fx", "two.example", "*/*"), ("/p", "one.example", "*/*")]
    for path, host, accept in cases:
        fields = [("Host", host), ("Accept", accept)]
        seen = http_scope(server.port, path, fields)
        assert seen["headers"] == [["host", host], ["accept", accept], ["connection", "close"]], seen
        assert seen["raw_path"] == path
        assert seen["path"] == path.replace("%2F", "/")


def test_a_websocket_and_a_request_of_one_route_share_nothing_mutable(server: ServerProcess) -> None:
    # The app appends a header and rebinds path on every scope; none of it reaches the next one.
    first = ws_scope(server.port, "/same", ws_fields("h.example", "a"))
    second = http_scope(server.port, "/same", [("Host", "h.example"), ("User-Agent", "a")])
    third = ws_scope(server.port, "/same", ws_fields("h.example", "a"))
    for seen in (first, second, third):
        assert ["x-added-by-the-app", "1"] not in seen["headers"]
        assert seen["path"] == "/same"
    assert first["headers"][:-1] == third["headers"][:-1]


def ask(s: socket.socket, method: str, target: str) -> dict:
    """What the app saw of one request sent on the keep-alive connection `s`."""
    s.sendall(f"{method} {target} HTTP/1.1\r\nHost: k.example\r\nContent-Length: 0\r\n\r\n".encode())
    data = recv_until(s, b"\r\n\r\n")
    head, rest = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += s.recv(65536)
    return json.loads(rest[:length])


def assert_own_target(seen: dict, method: str, target: str, i: int) -> None:
    """The app saw this request's own method and target, and nothing an earlier scope was given."""
    raw_path, _, query = target.partition("?")
    path = raw_path.replace("%7E", "~")
    assert (seen["method"], seen["path"], seen["raw_path"], seen["query_string"]) == (
        method, path, raw_path, query), (i, target, seen)
    assert not seen["added_key"], (i, seen)


def test_a_target_asked_again_on_a_connection_gets_its_own_method_path_and_query(
        server: ServerProcess) -> None:
    # A connection's scopes share the objects of a target asked for again; each request still
    # sees its own method, path, raw_path and query_string, whatever the app did to the scope
    # of the one before, and a request for another target or with another method its own.
    asks = [("GET", "/same?q=1"), ("GET", "/same?q=1"), ("GET", "/same?q=1"), ("POST", "/same?q=1"),
            ("GET", "/other"), ("GET", "/same?q=1"), ("GET", "/same"), ("GET", "/same"),
            ("GET", "/same?q=2"), ("DELETE", "/%7Esame"), ("GET", "/%7Esame"), ("GET", "/same?q=1")]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        for i, (method, target) in enumerate(asks):
            assert_own_target(ask(s, method, target), method, target, i)


def test_connections_asking_in_turn_each_get_their_own_target(server: ServerProcess) -> None:
    # Two connections take turns, so the target asked just before is always the other one's: a
    # connection's scopes take a target or query from its own base when the bytes are the same,
    # and every request still sees its own method, path, raw_path and query_string.
    turns = [(("GET", "/a?x=1"), ("GET", "/b?y=2")), (("GET", "/a?x=1"), ("GET", "/b?y=2")),
             (("GET", "/a?x=1"), ("PUT", "/b?y=3")), (("GET", "/a?x=2"), ("GET", "/b?y=2")),
             (("GET", "/a%7E"), ("GET", "/a?x=1")), (("GET", "/a?x=1"), ("GET", "/b")),
             (("GET", "/a"), ("GET", "/b?y=2")), (("GET", "/a?x=1"), ("GET", "/b?y=2"))]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as one, \
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as two:
        for i, pair in enumerate(turns):
            for s, (method, target) in zip((one, two), pair):
                assert_own_target(ask(s, method, target), method, target, i)


def test_requests_of_one_keep_alive_connection_each_get_a_fresh_scope(server: ServerProcess) -> None:
    # From a connection's second request on, its scopes are copies of one made for the connection:
    # what the app changed in a scope before, and the version of the request before, stay out.
    versions = ["1.1", "1.1", "1.0", "1.1", "1.1", "1.0"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        local = s.getsockname()
        data = b""
        for i, version in enumerate(versions):
            keep = "Connection: keep-alive\r\n" if version == "1.0" else ""
            s.sendall(f"GET /k{i} HTTP/{version}\r\nHost: k.example\r\n{keep}\r\n".encode())
            data = recv_until(s, b"\r\n\r\n")
            head, rest = data.split(b"\r\n\r\n", 1)
            assert head.startswith(f"HTTP/1.1 200".encode()), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += s.recv(65536)
            seen = json.loads(rest[:length])
            assert seen["http_version"] == version, (i, seen)
            assert seen["client"] == [local[0], local[1]], (i, seen)
            assert seen["server"] == ["127.0.0.1", server.port], (i, seen)
            assert seen["path"] == f"/k{i}" and not seen["added_key"], (i, seen)
            assert ["x-added-by-the-app", "1"] not in seen["headers"]


def first_request(port: int, method: str, target: str, version: str = "1.1") -> tuple[dict, tuple]:
    """What the app saw of the only request of a new connection, and the client's own address."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        local = s.getsockname()
        s.sendall(f"{method} {target} HTTP/{version}\r\nHost: f.example\r\nContent-Length: 0\r\n"
                  f"Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body), local


def test_new_connections_each_get_their_own_request_line(server: ServerProcess) -> None:
    # A connection's first request copies a scope made for the first request before it when it asks
    # the same (method, target, query, version): each still sees its own request line and client,
    # whatever the app did to the scope before, and a request that differs in any one part its own.
    asks = [("GET", "/f?a=1", "1.1")] * 3 + [
        ("POST", "/f?a=1", "1.1"), ("GET", "/f?a=1", "1.0"), ("GET", "/f?a=2", "1.1"), ("GET", "/f", "1.1"),
        ("GET", "/g?a=1", "1.1"), ("GET", "/f?a=1", "1.1"), ("PATCH", "/%7Ef", "1.1"), ("GET", "/f?a=1", "1.1")]
    asks += [("GET", f"/n{i}?i={i}", "1.1") for i in range(20)]  # a new target each: the copy is made anew
    asks += [("GET", "/n19?i=19", "1.1"), ("GET", "/f?a=1", "1.1"), ("GET", "/n19?i=19", "1.1")] * 3
    for i, (method, target, version) in enumerate(asks):
        seen, local = first_request(server.port, method, target, version)
        assert_own_target(seen, method, target, i)
        assert seen["http_version"] == version, (i, seen)
        assert seen["client"] == [local[0], local[1]], (i, seen)
        assert seen["server"] == ["127.0.0.1", server.port], (i, seen)
        assert ["x-added-by-the-app", "1"] not in seen["headers"], (i, seen)
