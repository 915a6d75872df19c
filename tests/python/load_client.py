"""A load client that counts every response: threads on keep-alive HTTP/1.1 connections.

Used by tests/python/test_fleet.py (a rolling restart behind a proxy must not fail one
request) and by scripts/sanitize-server (a minute of mixed load on a sanitized server):

    python tests/python/load_client.py HOST PORT --seconds 60 --clients 8 --mix sanitize

prints one JSON summary line and exits 1 if any request failed.

A request fails when the answer is not the expected status or body, or when the
connection breaks before its response is complete. A connection the server ends with
`Connection: close` after a complete response is not a failure: the client reconnects.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from server_harness import read_response


@dataclass(frozen=True)
class Request:
    """One request of the mix and what a correct answer looks like."""

    method: str
    target: str
    body: bytes = b""
    chunked: bool = False
    status: int = 200
    check: Callable[[bytes], bool] | None = None  # None: any body

    def wire(self, host: str, seq: int = 0) -> bytes:
        """The request's bytes; "{n}" in the target becomes `seq` (a number unique in the run)."""
        target = self.target.replace("{n}", str(seq))
        head = f"{self.method} {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: cadeloop-load\r\n"
        if self.chunked:
            parts = [self.body[i:i + 4096] for i in range(0, len(self.body), 4096)]
            payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
            return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + payload
        if self.body or self.method == "POST":
            head += f"Content-Length: {len(self.body)}\r\n"
        return (head + "\r\n").encode() + self.body


def sanitize_mix() -> list[Request]:
    """Every way a request and a response can travel through raw_app (tests/python/server_apps)."""
    body = bytes(range(256)) * 40  # 10 KiB
    import hashlib

    digest = hashlib.sha256(body).hexdigest()
    return [
        Request("GET", "/hello", check=lambda b: b == b"Hello, World!"),
        Request("POST", "/echo", body, check=lambda b: b == body),
        Request("POST", "/upload", body, chunked=True, check=lambda b: json.loads(b)["sha256"] == digest),
        Request("GET", "/chunked", check=lambda b: b == b"one,two,three"),
        Request("GET", "/stream?n=20&delay=0", check=lambda b: b.count(b"tick") == 20),
        Request("GET", "/big?mb=1", check=lambda b: len(b) == 1 << 20),
        Request("GET", "/scope?q=%C3%A9&x=1", check=lambda b: json.loads(b)["query_string"] == "q=%C3%A9&x=1"),
        Request("GET", "/slow?delay=0.005", check=lambda b: b == b"slow done"),
        Request("GET", "/nothing-here", status=404),
    ]


class Load:
    """`clients` threads sending `mix` round-robin until stop(); every answer is counted.

    on_response(status, headers, body) is called for each complete response (under a lock).
    """

    def __init__(self, host: str, port: int, mix: list[Request], clients: int = 8,
                 on_response: Callable[[int, dict[str, str], bytes], None] | None = None) -> None:
        self.host, self.port, self.mix = host, port, mix
        self.on_response = on_response
        self.statuses: collections.Counter[int] = collections.Counter()
        self.completed = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "a load client thread is stuck"

    def _fail(self, what: str) -> None:
        with self._lock:
            self.failures.append(what)

    def _client(self, index: int) -> None:
        n = index
        while not self._stop.is_set():
            try:
                s = socket.create_connection((self.host, self.port), timeout=15)
            except OSError as exc:
                self._fail(f"connect: {exc!r}")
                time.sleep(0.05)
                continue
            with s:
                f = s.makefile("rb")
                while not self._stop.is_set():
                    req = self.mix[n % len(self.mix)]
                    n += 1
                    seq = next(self._seq)
                    try:
                        s.sendall(req.wire(self.host, seq))
                        status, headers, body = read_response(f)
                    except (OSError, EOFError, ValueError, IndexError) as exc:
                        self._fail(f"{req.method} {req.target.replace('{n}', str(seq))}: {exc!r}")
                        break
                    with self._lock:
                        self.statuses[status] += 1
                        self.completed += 1
                        if self.on_response:
                            self.on_response(status, headers, body)
                    if status != req.status:
                        self._fail(f"{req.method} {req.target.replace('{n}', str(seq))}: status {status}, expected {req.status}: {body[:200]!r}")
                    elif req.check and not req.check(body):
                        self._fail(f"{req.method} {req.target.replace('{n}', str(seq))}: unexpected body {body[:200]!r}")
                    if headers.get("connection", "").lower() == "close":
                        break

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {"completed": self.completed, "statuses": dict(self.statuses),
                    "failed": len(self.failures), "first_failures": self.failures[:5]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--mix", choices=["sanitize"], default="sanitize")
    a = p.parse_args()
    load = Load(a.host, a.port, sanitize_mix(), clients=a.clients).start()
    start = time.monotonic()
    time.sleep(a.seconds)
    load.stop()
    out = load.summary()
    out["seconds"] = round(time.monotonic() - start, 1)
    out["per_second"] = round(load.completed / out["seconds"])  # type: ignore[operator]
    print(json.dumps(out), flush=True)
    return 1 if load.failures or not load.completed else 0


if __name__ == "__main__":
    sys.exit(main())
