"""TLS in the I/O threads: a real `cadeloop APP --ssl-keyfile K --ssl-certfile C` on loopback,
talked to with httpx, curl, `openssl s_client`, websockets and raw sockets. Certificates are
made here with trustme. Run with both Pythons: 3.13 (sub-interpreter pairs) and 3.11 (one
process per pair)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from server_harness import APPS, ServerProcess


@dataclass
class Certs:
    ca: Path
    cert: Path
    key: Path
    key_encrypted: Path
    other_key: Path
    client: Path  # a client certificate and its key, issued by the same CA
    stranger: Path  # a client certificate from another CA
    other_cert: Path  # another server certificate (the reload test's new one)
    other_cert_key: Path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    other = ca.issue_cert("127.0.0.1", "localhost", common_name="the second certificate")
    client = ca.issue_cert("alice@example.org", common_name="alice")
    stranger = trustme.CA().issue_cert("mallory@example.org", common_name="mallory")
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"s3cret"))
    return Certs(
        ca=_write(d / "ca.pem", ca.cert_pem.bytes()),
        cert=_write(d / "cert.pem", b"".join(b.bytes() for b in server.cert_chain_pems)),
        key=_write(d / "key.pem", server.private_key_pem.bytes()),
        key_encrypted=_write(d / "key-encrypted.pem", encrypted),
        other_key=_write(d / "other-key.pem", other.private_key_pem.bytes()),
        client=_write(d / "client.pem", client.private_key_and_cert_chain_pem.bytes()),
        stranger=_write(d / "stranger.pem", stranger.private_key_and_cert_chain_pem.bytes()),
        other_cert=_write(d / "other-cert.pem", b"".join(b.bytes() for b in other.cert_chain_pems)),
        other_cert_key=_write(d / "other-cert-key.pem", other.private_key_pem.bytes()),
    )


def start(certs: Certs, tmp_path: Path, *args: str, cores: int = 1, key: Path | None = None) -> ServerProcess:
    return ServerProcess("tls_app:app", "--cores", str(cores), "--ssl-certfile", str(certs.cert),
                         "--ssl-keyfile", str(key or certs.key), *args, tmp=tmp_path).start()


def https(s: ServerProcess) -> str:
    return f"https://127.0.0.1:{s.port}"


def client_context(certs: Certs, cert: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert))
    return ctx


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cadeloop", "tls_app:app", "--app-dir", str(APPS), *args],
                          capture_output=True, text=True, timeout=timeout)


def s_client(port: int, *args: str, stdin: bytes = b"", timeout: float = 20) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", *args],
                       input=stdin, capture_output=True, timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(errors="replace"),
                                       p.stderr.decode(errors="replace"))


def stats(port: int) -> dict[str, object]:
    return httpx.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- HTTPS end to end


def test_httpx_and_curl_over_https_on_two_pairs(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path, cores=2)
    try:
        ctx = client_context(certs)
        with httpx.Client(verify=ctx, timeout=10) as client:
            for _ in range(5):  # keep-alive: one connection, several requests
                r = client.get(https(s) + "/")
                assert r.status_code == 200 and r.http_version == "HTTP/1.1"
                assert r.json()["scheme"] == "https"
            r = client.post(https(s) + "/upload", content=b"y" * 1_000_000)
            assert r.json()["received"] == 1_000_000
        for _ in range(8):  # a fresh connection each: SO_REUSEPORT spreads them over both pairs
            with httpx.Client(verify=ctx, timeout=10) as client:
                assert client.get(https(s) + "/").json()["scheme"] == "https"
        p = subprocess.run(["curl", "-sS", "--cacert", str(certs.ca), https(s) + "/curl"],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["scheme"] == "https"
        # Without the CA, curl refuses the certificate: the server really presents ours.
        p = subprocess.run(["curl", "-sS", https(s) + "/"], capture_output=True, text=True, timeout=20)
        assert p.returncode == 60, p.stderr
        # The start-up line names the scheme a user should type.
        assert f"listening on https://127.0.0.1:{s.port} (2 core pairs" in s.log()
    finally:
        assert s.stop() == 0, s.log()


def _server_pids(pid: int) -> list[int]:
    """The server process and its worker processes (3.11: one per pair)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(c) for c in (task / "children").read_text().split()]
    return pids


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_100_mib_download_and_upload_over_tls_in_bounded_memory(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        n = 100 * 1024 * 1024
        with httpx.Client(verify=client_context(certs), timeout=120) as client:
            assert client.get(https(s) + "/").status_code == 200  # warm: the pair's pools are made
            pids = _server_pids(s.pid)
            rss_before = {p: _status_kib(p, "VmRSS") for p in pids}
            for p in pids:
                Path(f"/proc/{p}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
            got = 0
            with client.stream("GET", https(s) + f"/big/{n}") as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes():
                    assert chunk.count(b"x") == len(chunk)
                    got += len(chunk)
            assert got == n

            def body():  # type: ignore[no-untyped-def]
                for _ in range(n // 65536):
                    yield b"z" * 65536

            assert client.post(https(s) + "/up", content=body()).json()["received"] == n
            # The peak resident size of each server process (VmHWM) stayed
            # within 64 MiB of where it was before 200 MiB went through it.
            grew = {p: (_status_kib(p, "VmHWM") - rss_before[p]) // 1024 for p in pids}
            assert max(grew.values()) < 64, f"MiB each server process grew by: {grew}"
    finally:
        assert s.stop() == 0, s.log()


def test_password_protected_key(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path, "--ssl-keyfile-password", "s3cret", key=certs.key_encrypted)
    try:
        r = httpx.get(https(s) + "/", verify=client_context(certs), timeout=10)
        assert r.json()["scheme"] == "https"
    finally:
        assert s.stop() == 0, s.log()


# ----------------------------------------------------------------------------- bad files


@pytest.mark.parametrize("case, expected", [
    ("missing cert", "ssl_certfile: {missing}: no such file"),
    ("missing key", "ssl_keyfile: {missing}: no such file"),
    ("cert is a directory", "ssl_certfile: {dir}: cannot be read (Is a directory)"),
    ("cert is not PEM", "ssl_certfile: {garbage}: is not a PEM certificate"),
    ("encrypted key, no password", "ssl_keyfile: {key_encrypted}: the key is encrypted and ssl_keyfile_password is not set"),
    ("wrong password", "ssl_keyfile: {key_encrypted}: wrong ssl_keyfile_password"),
    ("key of another cert", "ssl_keyfile: {other_key}: the key does not match the certificate in {cert}"),
    ("missing CA bundle", "ssl_ca_certs: {missing}: no such file"),
])
def test_bad_tls_file_is_one_line_and_exit_2(certs: Certs, tmp_path: Path, case: str, expected: str) -> None:
    missing = tmp_path / "nope.pem"
    garbage = _write(tmp_path / "garbage.pem", b"this is not a certificate\n")
    args = {"cert": str(certs.cert), "key": str(certs.key)}
    extra: list[str] = []
    if case == "missing cert":
        args["cert"] = str(missing)
    elif case == "missing key":
        args["key"] = str(missing)
    elif case == "cert is a directory":
        args["cert"] = str(tmp_path)
    elif case == "cert is not PEM":
        args["cert"] = str(garbage)
    elif case == "encrypted key, no password":
        args["key"] = str(certs.key_encrypted)
    elif case == "wrong password":
        args["key"] = str(certs.key_encrypted)
        extra = ["--ssl-keyfile-password", "wrong"]
    elif case == "key of another cert":
        args["key"] = str(certs.other_key)
    elif case == "missing CA bundle":
        extra = ["--ssl-ca-certs", str(missing), "--ssl-cert-reqs", "2"]
    port = free_port()
    p = run_cli("--port", str(port), "--ssl-certfile", args["cert"], "--ssl-keyfile", args["key"], *extra)
    line = expected.format(missing=missing, dir=tmp_path, garbage=garbage, key_encrypted=certs.key_encrypted,
                           other_key=certs.other_key, cert=certs.cert)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and line in p.stderr, p.stderr
    assert "listening" not in p.stderr


def test_cert_reqs_without_ca_is_refused(certs: Certs) -> None:
    p = run_cli("--port", str(free_port()), "--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key),
                "--ssl-cert-reqs", "2")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "needs ssl_ca_certs" in p.stderr, p.stderr


# ----------------------------------------------------------------------------- careless and hostile clients


def test_plain_http_to_the_tls_port_gets_one_readable_400(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        assert data.startswith(b"HTTP/1.1 400 "), data
        assert b"plain HTTP to an HTTPS port" in data and data.count(b"HTTP/1.1") == 1
        # The port still speaks TLS to the next client.
        assert httpx.get(https(s) + "/", verify=client_context(certs), timeout=10).status_code == 200
    finally:
        assert s.stop() == 0, s.log()


def test_slow_handshake_is_cut(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path, "--request-line-timeout", "0.5")
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            sock.sendall(b"\x16\x03\x01")  # the first bytes of a client hello, then nothing
            t0 = time.monotonic()
            assert sock.recv(4096) == b""  # closed without a word (no HTTP 408 in plain text)
            assert time.monotonic() - t0 < 5
        assert httpx.get(https(s) + "/", verify=client_context(certs), timeout=10).status_code == 200
    finally:
        assert s.stop() == 0, s.log()


def test_handshake_bytes_are_bounded(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        # A client hello that claims 100,000 bytes (OpenSSL accepts up to ~128 KiB) sent in
        # handshake records: the server stops reading it after 64 KiB instead of waiting for
        # the rest until the (10 s) handshake timeout.
        body = struct.pack("!B", 1) + (100_000).to_bytes(3, "big") + b"\x03\x03" + b"\x00" * (16_000 - 6)
        records = [b"\x16\x03\x01" + struct.pack("!H", len(body)) + body]
        filler = b"\x00" * 16_000
        records += [b"\x16\x03\x01" + struct.pack("!H", len(filler)) + filler] * 4  # 80 KB in all
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            t0 = time.monotonic()
            try:
                for r in records:
                    sock.sendall(r)
                closed = sock.recv(4096) == b""
            except ConnectionResetError:
                closed = True
            assert closed and time.monotonic() - t0 < 5
    finally:
        assert s.stop() == 0, s.log()


def test_tls_versions_below_the_minimum_are_refused(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        ok = s_client(s.port, "-tls1_2", "-CAfile", str(certs.ca))
        assert "Protocol  : TLSv1.2" in ok.stdout, ok.stdout + ok.stderr
        for flag in ("-tls1", "-tls1_1"):
            # SECLEVEL=0 so the client does offer the old version; the server refuses it.
            p = s_client(s.port, flag, "-cipher", "DEFAULT@SECLEVEL=0")
            assert p.returncode != 0 and "alert protocol version" in p.stderr, p.stderr
    finally:
        assert s.stop() == 0, s.log()
    s = start(certs, tmp_path, "--ssl-min-version", "1.3")
    try:
        p = s_client(s.port, "-tls1_2")
        assert p.returncode != 0 and "alert protocol version" in p.stderr, p.stderr
        ok = s_client(s.port, "-tls1_3", "-CAfile", str(certs.ca))
        assert "TLSv1.3" in ok.stdout, ok.stdout
    finally:
        assert s.stop() == 0, s.log()


def test_alpn_answers_http11_to_a_client_that_offers_h2(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        p = s_client(s.port, "-alpn", "h2,http/1.1")
        assert "ALPN protocol: http/1.1" in p.stdout, p.stdout
        p = s_client(s.port, "-alpn", "h2")
        assert "No ALPN negotiated" in p.stdout, p.stdout
    finally:
        assert s.stop() == 0, s.log()


def test_session_resumption_with_a_ticket(certs: Certs, tmp_path: Path) -> None:
    stats_port = free_port()
    s = start(certs, tmp_path, "--stats-port", str(stats_port))
    try:
        request = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        sess = tmp_path / "session.pem"
        first = s_client(s.port, "-sess_out", str(sess), "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
        assert "HTTP/1.1 200" in first.stdout and sess.stat().st_size > 0, first.stdout
        second = tmp_path / "session-2.pem"
        again = s_client(s.port, "-sess_in", str(sess), "-sess_out", str(second), "-ign_eof", "-CAfile", str(certs.ca),
                         stdin=request)
        assert "Reused, TLSv1.3" in again.stdout and "HTTP/1.1 200" in again.stdout, again.stdout
        # A resumption gives the client a fresh ticket (TLS 1.3 clients use each once), which resumes in turn.
        assert "Post-Handshake New Session Ticket arrived" in again.stdout, again.stdout
        third = s_client(s.port, "-sess_in", str(second), "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
        assert "Reused, TLSv1.3" in third.stdout and "HTTP/1.1 200" in third.stdout, third.stdout
        tls = stats(stats_port)["totals"]["tls"]  # type: ignore[index]
        assert tls["resumed"] >= 2 and tls["handshakes"] >= 3, tls  # type: ignore[index]
        assert tls["versions"]["TLSv1.3"] >= 3, tls  # type: ignore[index]
    finally:
        assert s.stop() == 0, s.log()


def _get_over_tls(port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None) -> tuple[bool, ssl.SSLSession, bytes]:
    """One request on a new TLS connection: (resumed?, the session to resume next time, the response)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
            got = tls.session
            assert got is not None
            return tls.session_reused, got, data


def test_a_ticket_resumes_on_every_pair(certs: Certs, tmp_path: Path) -> None:
    # Two pairs, each with its own SO_REUSEPORT listener: the kernel spreads
    # the connections, and a ticket one pair made must open on the other.
    stats_port = free_port()
    s = start(certs, tmp_path, "--stats-port", str(stats_port), cores=2)
    try:
        ctx = client_context(certs)
        resumed, session, data = _get_over_tls(s.port, ctx, None)
        assert not resumed and data.startswith(b"HTTP/1.1 200"), data[:200]
        # Every other connection moves on to the newest ticket (the one the
        # last resumption gave, as a browser does); those between offer a
        # ticket that was used once already.
        results = []
        for i in range(40):
            resumed, newest, data = _get_over_tls(s.port, ctx, session)
            assert data.startswith(b"HTTP/1.1 200"), data[:200]
            results.append(resumed)
            if i % 2:
                session = newest
        refused = results.count(False)
        assert refused == 0, f"{refused} of 40 resumptions refused: {results}"
        metrics = httpx.get(f"http://127.0.0.1:{stats_port}/metrics", timeout=10).text
        per_pair = {m.group(1): int(m.group(2))
                    for m in re.finditer(r'cadeloop_tls_resumed_total\{pair="(\d+)"\} (\d+)', metrics)}
        assert len(per_pair) == 2 and min(per_pair.values()) > 0, (per_pair, metrics)
    finally:
        assert s.stop() == 0, s.log()


def _ticket_key_name(out: str) -> str:
    """The first 16 bytes of the last session ticket `openssl s_client` printed: the key name."""
    m = re.findall(r"TLS session ticket:\n\s*0000 - ((?:[0-9a-f]{2}[ -]){16})", out)
    assert m, out
    return m[-1].replace("-", " ").replace(" ", "")


def test_ticket_keys_rotate_and_the_previous_key_still_opens(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path, "--ssl-ticket-rotation", "2")
    try:
        request = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        first = tmp_path / "first.pem"
        p = s_client(s.port, "-sess_out", str(first), "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
        assert "HTTP/1.1 200" in p.stdout, p.stdout
        first_key = _ticket_key_name(p.stdout)
        # New full handshakes until the server encrypts with another key.
        deadline = time.monotonic() + 10
        while True:
            p = s_client(s.port, "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
            if _ticket_key_name(p.stdout) != first_key:
                break
            assert time.monotonic() < deadline, "the ticket key did not change within 10 s (rotation 2 s)"
            time.sleep(0.2)
        # The first ticket, made with the previous key, still resumes...
        again = s_client(s.port, "-sess_in", str(first), "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
        assert "Reused, TLSv1.3" in again.stdout and "HTTP/1.1 200" in again.stdout, again.stdout
        # ...and two periods later it is refused: a full handshake, and the request is served.
        time.sleep(4.5)
        late = s_client(s.port, "-sess_in", str(first), "-ign_eof", "-CAfile", str(certs.ca), stdin=request)
        assert "New, TLSv1.3" in late.stdout and "HTTP/1.1 200" in late.stdout, late.stdout
    finally:
        assert s.stop() == 0, s.log()


# ----------------------------------------------------------------------------- the ASGI scope, mTLS, WSS


def test_scope_has_scheme_https_and_the_tls_extension(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        doc = httpx.get(https(s) + "/", verify=client_context(certs), timeout=10).json()
        assert doc["scheme"] == "https"
        tls = doc["tls"]
        assert tls["tls_version"] == 0x0304 and tls["cipher_suite"] in (0x1301, 0x1302, 0x1303), tls
        assert tls["has_server_cert"] and tls["client_cert_chain"] == 0 and tls["client_cert_name"] is None
        p = s_client(s.port, "-tls1_2", "-ign_eof", "-CAfile", str(certs.ca),
                     stdin=b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index('{"scheme"'):])
        assert body["tls"]["tls_version"] == 0x0303, body
    finally:
        assert s.stop() == 0, s.log()


def test_client_certificates_required(certs: Certs, tmp_path: Path) -> None:
    stats_port = free_port()
    s = start(certs, tmp_path, "--ssl-ca-certs", str(certs.ca), "--ssl-cert-reqs", "2",
              "--stats-port", str(stats_port))
    try:
        with httpx.Client(verify=client_context(certs, certs.client), timeout=10) as client:
            tls = client.get(https(s) + "/").json()["tls"]
        assert tls["client_cert_chain"] >= 1 and "CN=alice" in tls["client_cert_name"], tls
        assert tls["client_cert_error"] is None
        for ctx in (client_context(certs), client_context(certs, certs.stranger)):
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                httpx.get(https(s) + "/", verify=ctx, timeout=10)
        failures = stats(stats_port)["totals"]["tls"]["failures"]  # type: ignore[index]
        assert failures["client_cert"] >= 2, failures  # type: ignore[index]
    finally:
        assert s.stop() == 0, s.log()


def test_client_certificates_optional(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path, "--ssl-ca-certs", str(certs.ca), "--ssl-cert-reqs", "1")
    try:
        tls = httpx.get(https(s) + "/", verify=client_context(certs), timeout=10).json()["tls"]
        assert tls["client_cert_chain"] == 0 and tls["client_cert_name"] is None
        tls = httpx.get(https(s) + "/", verify=client_context(certs, certs.client), timeout=10).json()["tls"]
        assert "CN=alice" in tls["client_cert_name"]
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.get(https(s) + "/", verify=client_context(certs, certs.stranger), timeout=10)
    finally:
        assert s.stop() == 0, s.log()


def test_wss_with_the_websockets_client(certs: Certs, tmp_path: Path) -> None:
    from websockets.sync.client import connect

    s = start(certs, tmp_path, cores=2)
    try:
        with connect(f"wss://127.0.0.1:{s.port}/ws", ssl=client_context(certs), open_timeout=10) as ws:
            hello = json.loads(ws.recv(timeout=10))
            assert hello["scheme"] == "wss" and hello["tls"]["tls_version"] in (0x0303, 0x0304), hello
            for i in range(20):
                ws.send(f"message {i}" * 100)
                assert ws.recv(timeout=10) == f"message {i}" * 100
            big = os.urandom(1_000_000)
            ws.send(big)
            assert ws.recv(timeout=10) == big
    finally:
        assert s.stop() == 0, s.log()


def test_plain_http_and_timeouts_are_counted(certs: Certs, tmp_path: Path) -> None:
    stats_port = free_port()
    s = start(certs, tmp_path, "--request-line-timeout", "0.3", "--stats-port", str(stats_port))
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            while sock.recv(4096):
                pass
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.sendall(b"\x16\x03\x01")
            assert sock.recv(4096) == b""
        failures = stats(stats_port)["totals"]["tls"]["failures"]  # type: ignore[index]
        assert failures["plain_http"] == 1 and failures["timeout"] == 1, failures
        metrics = httpx.get(f"http://127.0.0.1:{stats_port}/metrics", timeout=10).text
        assert 'cadeloop_tls_handshake_failures_total{pair="0",reason="plain_http"} 1' in metrics, metrics
    finally:
        assert s.stop() == 0, s.log()


# ----------------------------------------------------------------------------- reload


def _served_common_name(port: int, ctx: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            cert = tls.getpeercert()
    names = [v for rdn in cert["subject"] for (k, v) in rdn if k == "commonName"]
    return names[0] if names else ""


@pytest.mark.parametrize("cores", [1, 2])
def test_sighup_reloads_the_certificate_under_load(certs: Certs, tmp_path: Path, cores: int) -> None:
    import shutil
    import threading

    cert, key = tmp_path / "live-cert.pem", tmp_path / "live-key.pem"
    shutil.copy(certs.cert, cert)
    shutil.copy(certs.key, key)
    s = ServerProcess("tls_app:app", "--cores", str(cores), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
                      tmp=tmp_path).start()
    ctx = client_context(certs)
    failures: list[str] = []
    done = threading.Event()
    count = 0

    def load() -> None:
        nonlocal count
        while not done.is_set():
            try:
                with httpx.Client(verify=ctx, timeout=10) as c:
                    for _ in range(3):
                        assert c.get(https(s) + "/").status_code == 200
                        count += 1
            except Exception as exc:  # noqa: BLE001 - every failure is what the test counts
                failures.append(repr(exc))

    try:
        first = _served_common_name(s.port, ctx)
        kept = httpx.Client(verify=ctx, timeout=10)
        assert kept.get(https(s) + "/").status_code == 200  # an open keep-alive connection
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        # The new files replace the old ones whole, as a deploy does.
        shutil.copy(certs.other_cert, tmp_path / "next-cert.pem")
        shutil.copy(certs.other_cert_key, tmp_path / "next-key.pem")
        os.replace(tmp_path / "next-cert.pem", cert)
        os.replace(tmp_path / "next-key.pem", key)
        os.kill(s.pid, signal.SIGHUP)
        s.wait_log("TLS certificate and key reloaded")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # every serving process has reloaded
            if all(_served_common_name(s.port, ctx) == "the second certificate" for _ in range(8)):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"new connections still get the old certificate:\n{s.log()}")
        assert first != "the second certificate"
        assert kept.get(https(s) + "/").status_code == 200  # the open connection was kept
        # A bad new file: one line, and the certificate loaded last stays.
        key.write_bytes(b"not a key\n")
        os.kill(s.pid, signal.SIGHUP)
        line = s.wait_log(r"TLS reload refused, the old certificate stays: ssl_keyfile: .*live-key\.pem: .*").group(0)
        assert "\n" not in line
        assert _served_common_name(s.port, ctx) == "the second certificate"
        done.set()
        for t in threads:
            t.join(30)
        kept.close()
        assert failures == [] and count > 0, failures[:3]
        assert s.proc is not None and s.proc.poll() is None  # SIGHUP did not stop the server
    finally:
        done.set()
        assert s.stop() == 0, s.log()


def test_renegotiation_is_refused(certs: Certs, tmp_path: Path) -> None:
    s = start(certs, tmp_path)
    try:
        p = subprocess.Popen(["openssl", "s_client", "-connect", f"127.0.0.1:{s.port}", "-tls1_2"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert p.stdin is not None
        p.stdin.write(b"R\n")  # s_client's command for a renegotiation
        p.stdin.flush()
        time.sleep(1.5)  # the server's refusal ends the session; s_client exits
        out, _ = p.communicate(timeout=20)
        text = out.decode(errors="replace")
        assert "RENEGOTIATING" in text and "no renegotiation" in text, text
        assert httpx.get(https(s) + "/", verify=client_context(certs), timeout=10).status_code == 200
    finally:
        assert s.stop() == 0, s.log()
