"""ASGI response extensions on a real server: http.response.pathsend and http.response.trailers.

pathsend: the app names a file, the server's I/O thread sends it (sendfile(2) on plain TCP,
bounded reads under TLS). Checked from outside: the bytes (sha256) and Content-Length of a
20 MiB file through a raw ASGI app and through Starlette's FileResponse, HEAD, pipelining, a
1 GiB sparse file with the server's memory bounded while the client does not read, the write
timeout cutting such a client, TLS, and the refusals (missing file, relative path).
trailers: a chunked body with its trailer section for a client that sent `TE: trailers`, none
otherwise, parsed from a raw socket.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import trustme

from server_harness import ServerProcess, raw_exchange, read_response

MIB = 1 << 20


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        srv = ServerProcess("extensions_app:app", *args, tmp=tmp_path).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("files") / "big.bin"
    path.write_bytes(os.urandom(20 * MIB + 12345))  # not a multiple of any chunk size
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(url: str, **kw: Any) -> tuple[httpx.Response, str, int]:
    h = hashlib.sha256()
    n = 0
    with httpx.stream("GET", url, timeout=30, **kw) as r:
        for chunk in r.iter_raw():
            h.update(chunk)
            n += len(chunk)
    return r, h.hexdigest(), n


def test_both_extensions_are_advertised(serve: Any) -> None:
    srv = serve()
    r = httpx.get(srv.url + "/extensions")
    assert r.json() == ["http.response.pathsend", "http.response.trailers"]


@pytest.mark.parametrize("route", ["raw", "starlette"])
def test_pathsend_sends_the_whole_file(serve: Any, big_file: Path, route: str) -> None:
    srv = serve()
    r, digest, n = fetch(f"{srv.url}/{route}", params={"file": str(big_file)})
    assert r.status_code == 200
    assert int(r.headers["content-length"]) == big_file.stat().st_size == n
    assert digest == sha256_of(big_file)
    # The connection is reusable afterwards: a second one on a keep-alive client.
    with httpx.Client(base_url=srv.url) as c:
        for _ in range(2):
            r = c.get(f"/{route}", params={"file": str(big_file)})
            assert hashlib.sha256(r.content).hexdigest() == digest
    assert "Traceback" not in srv.log()


def test_pathsend_on_every_core(serve: Any, big_file: Path) -> None:
    """Two pairs (sub-interpreters on 3.13 under auto, processes on 3.11): each sends the file whole."""
    srv = serve("--cores", "2")
    digest = sha256_of(big_file)
    for _ in range(6):  # fresh connections, spread over both pairs by the kernel
        r, got, n = fetch(f"{srv.url}/starlette", params={"file": str(big_file)})
        assert r.status_code == 200 and n == big_file.stat().st_size and got == digest


def test_pathsend_small_empty_and_head(serve: Any, tmp_path: Path) -> None:
    srv = serve()
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello, file\n")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for route in ("raw", "starlette"):
        r = httpx.get(f"{srv.url}/{route}", params={"file": str(small)})
        assert r.status_code == 200 and r.content == b"hello, file\n"
        r = httpx.get(f"{srv.url}/{route}", params={"file": str(empty)})
        assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"
        # HEAD: the length of the file, no body; the connection then carries a GET.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            f = s.makefile("rb")
            s.sendall(f"HEAD /{route}?file={small} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            line = f.readline()
            assert line.startswith(b"HTTP/1.1 200")
            headers = {}
            while (h := f.readline()) != b"\r\n":
                k, _, v = h.decode().partition(":")
                headers[k.lower()] = v.strip()
            assert headers["content-length"] == str(len(b"hello, file\n"))
            s.sendall(f"GET /{route}?file={small} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, _, body = read_response(f)
            assert status == 200 and body == b"hello, file\n"


def test_pathsend_pipelined_responses_stay_in_order(serve: Any, tmp_path: Path) -> None:
    srv = serve()
    files = []
    for i in range(4):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(bytes([65 + i]) * (300_000 + i))
        files.append(p)
    req = b"".join(f"GET /raw?file={p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in files)
    req += b"GET /extensions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(req)
        f = s.makefile("rb")
        for p in files:
            status, _, body = read_response(f)
            assert status == 200 and body == p.read_bytes()
        status, _, body = read_response(f)
        assert status == 200 and json.loads(body)[0] == "http.response.pathsend"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_pathsend_1gib_sparse_file_with_a_client_that_stops_reading(serve: Any, tmp_path: Path) -> None:
    srv = serve()
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)
        f.seek((1 << 30) - 4)
        f.write(b"END!")
    base = _rss_kib(srv.pid)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(f"GET /raw?file={sparse} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 1073741824" in head.lower()
        time.sleep(1.0)  # the client reads nothing: the server must not buffer the file
        stalled = _rss_kib(srv.pid)
        assert stalled - base < 64 * 1024, (base, stalled)
        # Other clients are served meanwhile.
        assert httpx.get(srv.url + "/extensions").status_code == 200
        # Then the client reads it all.
        got = len(head) - head.index(b"\r\n\r\n") - 4
        tail = b""
        buf = bytearray(4 * MIB)
        while got < (1 << 30):
            n = s.recv_into(buf)
            assert n > 0, got
            got += n
            tail = (tail + bytes(buf[max(0, n - 4):n]))[-4:]
        assert got == 1 << 30 and tail == b"END!"
    assert _rss_kib(srv.pid) - base < 64 * 1024


def test_pathsend_write_timeout_cuts_a_client_that_never_reads(serve: Any, big_file: Path) -> None:
    srv = serve("--write-timeout", "1")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(f"GET /raw?file={big_file} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(2.5)  # past the write timeout with nothing read
        got = 0
        while (n := len(s.recv(MIB))) > 0:
            got += n
        assert got < big_file.stat().st_size  # closed before the end: the client saw a cut response
    assert httpx.get(srv.url + "/extensions").status_code == 200


def test_pathsend_refusals_are_500s_with_one_log_record(serve: Any, tmp_path: Path) -> None:
    srv = serve()
    for name, exc in ((str(tmp_path / "missing.bin"), "FileNotFoundError"), ("relative/file.bin", "ValueError"),
                      (str(tmp_path), "ValueError")):
        r = httpx.get(srv.url + "/raw", params={"file": name})
        assert r.status_code == 500 and r.headers["connection"] == "close"
        srv.wait_log(f"pathsend refused: {exc}")
    log = srv.log()
    assert log.count("Exception in ASGI application") == 3, log
    assert "must be absolute" in log and "not a regular file" in log
    assert httpx.get(srv.url + "/extensions").status_code == 200


def test_pathsend_over_tls(tmp_path: Path, big_file: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    (tmp_path / "cert.pem").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    (tmp_path / "key.pem").write_bytes(cert.private_key_pem.bytes())
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    srv = ServerProcess("extensions_app:app", "--ssl-certfile", str(tmp_path / "cert.pem"),
                        "--ssl-keyfile", str(tmp_path / "key.pem"), tmp=tmp_path).start()
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        for route in ("raw", "starlette"):
            r, digest, n = fetch(f"https://127.0.0.1:{srv.port}/{route}", params={"file": str(big_file)},
                                 verify=ctx)
            assert r.status_code == 200 and n == big_file.stat().st_size
            assert int(r.headers["content-length"]) == n and digest == sha256_of(big_file)
        r = httpx.get(f"https://127.0.0.1:{srv.port}/extensions", verify=ctx)
        assert set(r.json()) == {"http.response.pathsend", "http.response.trailers", "tls"}
    finally:
        assert srv.stop() == 0, srv.log()


# ------------------------------------------------------------------------------------ trailers

def read_chunked_with_trailers(f: Any) -> tuple[int, dict[str, str], bytes, dict[str, str]]:
    status = int(f.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) != b"\r\n":
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = b""
    trailers: dict[str, str] = {}
    if headers.get("transfer-encoding") != "chunked":
        return status, headers, f.read(int(headers["content-length"])), trailers
    while True:
        size = int(f.readline().split(b";")[0], 16)
        if size == 0:
            break
        body += f.read(size)
        assert f.read(2) == b"\r\n"
    while (line := f.readline()) != b"\r\n":
        assert line, "connection closed inside the trailer section"
        k, _, v = line.decode().partition(":")
        trailers[k.strip().lower()] = v.strip()
    return status, headers, body, trailers


def test_trailers_sent_to_a_client_that_asked(serve: Any) -> None:
    srv = serve()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        f = s.makefile("rb")
        for te in ("trailers", "gzip, Trailers;q=1"):
            s.sendall(f"GET /trailers?chunks=3 HTTP/1.1\r\nHost: x\r\nTE: {te}\r\n\r\n".encode())
            status, headers, body, trailers = read_chunked_with_trailers(f)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            assert body == b"part 0\npart 1\npart 2\n"
            assert trailers == {"x-checksum": "abc123", "x-count": "3"}
        # The connection stays usable (the trailer section was framed right).
        s.sendall(b"GET /extensions HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_response(f)
        assert status == 200 and b"pathsend" in body
    # curl with --raw shows the chunked body and the trailer section as they came.
    out = subprocess.run(["curl", "-sS", "--raw", "-H", "TE: trailers", srv.url + "/trailers?chunks=2"],
                         capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith(b"0\r\nx-checksum: abc123\r\nx-count: 2\r\n\r\n"), out.stdout
    assert b"part 0\n" in out.stdout and b"part 1\n" in out.stdout


def test_trailers_dropped_without_te_trailers(serve: Any) -> None:
    srv = serve()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        f = s.makefile("rb")
        for chunks in (1, 3):
            s.sendall(f"GET /trailers?chunks={chunks} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, body, trailers = read_chunked_with_trailers(f)
            assert status == 200 and trailers == {}
            assert body == b"".join(f"part {i}\n".encode() for i in range(chunks))
    # A real client sees the same body either way.
    assert httpx.get(srv.url + "/trailers", headers={"TE": "trailers"}).text == "part 0\npart 1\npart 2\n"
    out = raw_exchange(srv.port, b"GET /trailers HTTP/1.0\r\nHost: x\r\nTE: trailers\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert body == b"part 0\npart 1\npart 2\n"  # close-delimited for HTTP/1.0: no chunks, no trailers
