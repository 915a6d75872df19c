"""Server CPU per file response: http.response.pathsend against an app that reads and sends the file.

Starts one `python -m cadeloop` process (one core pair) with an app of two
routes: `/pathsend` (one `http.response.pathsend` message: the I/O thread
sends the file, sendfile(2) on plain TCP) and `/chunks` (the app reads the
file in 64 KiB pieces and sends each as an `http.response.body`, as a
streaming FileResponse does without the extension). A client fetches the
file N times on one keep-alive connection per route, checking every byte
count, and the server's user+system CPU is read from /proc/PID/stat before
and after each run. Prints a Markdown table and writes it (command, machine,
load average, date) under bench/results/.

    .venv/bin/python bench/files/pathsend_cpu.py --size-mib 64 --requests 50
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = '''
from urllib.parse import parse_qs

async def app(scope, receive, send):
    if scope["type"] != "http":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = parse_qs(scope["query_string"].decode())["file"][0]
    if scope["path"] == "/pathsend":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.pathsend", "path": path})
        return
    import os
    size = os.stat(path).st_size
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(size).encode())]})
    with open(path, "rb") as f:
        while True:
            piece = f.read(65536)
            await send({"type": "http.response.body", "body": piece, "more_body": bool(piece)})
            if not piece:
                break
'''

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def fetch_all(port: int, target: str, n: int, size: int) -> None:
    buf = bytearray(1 << 22)
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(n):
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("closed before the head")
                head += chunk
            got = len(head) - head.index(b"\r\n\r\n") - 4
            assert head.startswith(b"HTTP/1.1 200"), head[:100]
            while got < size:
                k = s.recv_into(buf)
                if k == 0:
                    raise RuntimeError(f"closed after {got} of {size} bytes")
                got += k
            assert got == size, (got, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help="results file (default: bench/results/DATE-pathsend-cpu.md)")
    args = ap.parse_args()
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "bench_pathsend_app.py").write_text(APP)
        data = d / "file.bin"
        data.write_bytes(os.urandom(size))
        log = open(d / "server.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "cadeloop", "bench_pathsend_app:app", "--app-dir", str(d),
                                 "--host", "127.0.0.1", "--port", "0"], stdout=log, stderr=subprocess.STDOUT)
        try:
            port = 0
            deadline = time.monotonic() + 30
            while not port and time.monotonic() < deadline:
                m = LISTENING.search((d / "server.log").read_text())
                port = int(m.group(1)) if m else 0
                time.sleep(0.05)
            assert port, (d / "server.log").read_text()
            rows = []
            for route in ("pathsend", "chunks"):
                target = f"/{route}?file={data}"
                fetch_all(port, target, 2, size)  # warm the page cache and the route
                c0, t0 = cpu_seconds(proc.pid), time.monotonic()
                fetch_all(port, target, args.requests, size)
                c1, t1 = cpu_seconds(proc.pid), time.monotonic()
                gib = args.requests * size / (1 << 30)
                rows.append((route, (c1 - c0) * 1000 / args.requests, (c1 - c0) / gib, gib / (t1 - t0)))
        finally:
            proc.terminate()
            proc.wait(30)
    load = os.getloadavg()
    lines = [
        f"# pathsend: server CPU per file response ({datetime.date.today()})",
        "",
        f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  ",
        f"File: {args.size_mib} MiB of random bytes, {args.requests} responses per route on one keep-alive "
        "connection (loopback), after 2 warm-up responses. CPU: utime+stime of the server process "
        "from /proc/PID/stat; wall-clock throughput is noisy on a loaded machine.",
        "",
        "| route | server CPU ms / response | server CPU s / GiB | GiB/s (wall) |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r}` | {ms:.1f} | {s:.3f} | {g:.2f} |" for r, ms, s, g in rows]
    lines.append("")
    lines.append(f"pathsend uses {rows[1][1] / max(rows[0][1], 1e-9):.1f}x less server CPU than the app "
                 "reading and sending the file.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or Path(__file__).resolve().parents[1] / "results" / f"{datetime.date.today()}-pathsend-cpu.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
