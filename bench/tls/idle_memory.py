"""Memory per idle TLS keep-alive connection of a real `cadeloop --ssl-*` server.

Starts `python -m cadeloop` (one core pair, so one process) with a trustme
certificate, reads its USS (Private_Clean + Private_Dirty of
/proc/PID/smaps_rollup), opens N connections that each finish a TLS handshake
and one request, waits for them to go idle, and reads the USS again. The same
run with plain TCP separates what TLS adds. Prints a Markdown table and writes
it (with the command, machine and date) under bench/results/.

    .venv/bin/python bench/tls/idle_memory.py --conns 10000
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trustme

APP = '''
async def app(scope, receive, send):
    if scope["type"] != "http":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
'''


def uss_kib(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total


def start(workdir: Path, tls_args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    log = open(workdir / f"server-{len(tls_args)}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cadeloop", "idle_app:app", "--app-dir", str(workdir),
                             "--host", "127.0.0.1", "--port", "0", "--cores", "1",
                             "--max-connections", "100000", "--keepalive-idle", "3600", *tls_args],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180  # a loaded machine starts slowly
    while time.monotonic() < deadline:
        m = re.search(r"listening on https?://127\.0\.0\.1:(\d+)", (workdir / log.name).read_text())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    raise RuntimeError("server did not start")


def open_idle(port: int, n: int, ctx: ssl.SSLContext | None) -> list[socket.socket]:
    conns = []
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(request)
        got = b""
        while not got.endswith(b"ok"):
            got += s.recv(4096)
        conns.append(s)
    return conns


def measure(workdir: Path, n: int, tls_args: list[str], ctx: ssl.SSLContext | None) -> tuple[int, int]:
    proc, port = start(workdir, tls_args)
    try:
        open_idle(port, 50, ctx)  # warm-up: pools and caches that every server fills once
        time.sleep(1)
        before = uss_kib(proc.pid)
        conns = open_idle(port, n, ctx)
        time.sleep(2)
        after = uss_kib(proc.pid)
        for c in conns:
            c.close()
        return before, after
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    ap.add_argument("--name", default="tls-idle-memory", help="results file: OUT/DATE-NAME.md")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "idle_app.py").write_text(APP)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.cert_chain_pems[0].write_to_path(work / "cert.pem")
        cert.private_key_pem.write_to_path(work / "key.pem")
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        tls = ["--ssl-certfile", str(work / "cert.pem"), "--ssl-keyfile", str(work / "key.pem")]
        plain_before, plain_after = measure(work, args.conns, [], None)
        tls_before, tls_after = measure(work, args.conns, tls, ctx)
    plain = (plain_after - plain_before) / args.conns
    per = (tls_after - tls_before) / args.conns
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# Idle TLS keep-alive connection memory\n\n"
            f"Command: `{Path(sys.executable).name} bench/tls/idle_memory.py {' '.join(sys.argv[1:])}`  \n"
            f"Machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, "
            f"{ssl.OPENSSL_VERSION} (client)  \nDate: {date}; load average at the end: "
            f"{Path('/proc/loadavg').read_text().split()[0]}\n\n"
            f"Server: `cadeloop --cores 1 --keepalive-idle 3600`, USS = Private_Clean + Private_Dirty "
            f"(/proc/PID/smaps_rollup), after one request per connection and 2 s idle.\n\n"
            f"| connections | plain TCP KiB/conn | TLS KiB/conn | TLS adds KiB/conn |\n|---|---|---|---|\n"
            f"| {args.conns} | {plain:.2f} | {per:.2f} | {per - plain:.2f} |\n")
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{date[:10]}-{args.name}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
