#!/usr/bin/env python3
"""Does a second core pair double a CPU-bound app? And what does a pair cost in memory?

A pure-Python route doing about 5 ms of CPU work per request is served with
`--cores 1`, then `--cores 2` (same isolation, same work per request), and
loaded by wrk (Debian's `wrk`: `-t2 -c16`) for the same duration each, in one
invocation. Then the FastAPI example is started with 1 and with 2 pairs and
the RSS of the whole process tree (supervisor and workers) is summed.

    python bench/cores/cpu_bound.py --python .venv-cores/bin/python --isolation subinterpreters
    python bench/cores/cpu_bound.py --python .venv-cores-311/bin/python --isolation processes --append

Writes (or, with --append, adds a section to) bench/results/<date>-cores-scaling.md.

This file is also the app: `cadeloop cpu_bound:app --app-dir bench/cores`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# --------------------------------------------------------------------------- the app

#: Loop iterations of the CPU work; the driver calibrates it to ~5 ms and passes it to every pair.
WORK = int(os.environ.get("CPU_BOUND_WORK", "60000"))


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total = (total + i * i) % 1_000_003
    return total


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    body = str(work(WORK)).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- the driver

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def calibrate(python: str, target_ms: float = 5.0) -> tuple[int, float]:
    """Iterations for ~target_ms of work on `python` (measured in that interpreter), and the ms they take.

    CPU time of this process (not wall time), so other load on the machine does not skew it.
    """
    code = (
        f"import sys, time; sys.path.insert(0, {str(HERE)!r}); import cpu_bound as c\n"
        "def cpu_ms(n, reps=10):\n"
        "    t = time.process_time()\n"
        "    for _ in range(reps): c.work(n)\n"
        "    return (time.process_time() - t) * 1000 / reps\n"
        "n = 50000\n"
        "for _ in range(4):\n"
        f"    n = int(n * {target_ms} / cpu_ms(n))\n"
        "print(n, cpu_ms(n, 40))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), float(out[1])


def start(python: str, app: str, app_dir: Path, *args: str, env: dict[str, str] | None = None,
          log: Path) -> tuple[subprocess.Popen[bytes], int]:
    out = open(log, "wb")
    proc = subprocess.Popen([python, "-m", "cadeloop", app, "--app-dir", str(app_dir), "--host", "127.0.0.1",
                             "--port", "0", *args], stdout=out, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(env or {})))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = LISTENING.search(log.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        time.sleep(0.05)
    raise RuntimeError(f"server did not start: {log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(60)


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_cpu_ticks(pid: int) -> int:
    """utime+stime of pid and its descendants (every thread), in clock ticks."""
    total = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def tree_rss_kib(pid: int) -> int:
    """RSS of pid and every descendant, in KiB."""
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def wrk(port: int, duration: int, path: str = "/") -> float:
    out = subprocess.run(["wrk", "-t2", "-c16", f"-d{duration}s", f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m or "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk: {out}")
    return float(m.group(1))


def python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--isolation", choices=("subinterpreters", "processes"), required=True)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--append", action="store_true", help="add to today's note instead of starting it")
    parser.add_argument("--rss-app", default="fastapi_app:app", help="the app whose memory per pair is measured")
    parser.add_argument("--rss-app-dir", default=str(ROOT / "examples"))
    args = parser.parse_args()

    tmp = Path("/tmp") / f"cadeloop-cores-bench-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    version = python_version(args.python)
    n, ms = calibrate(args.python)
    env = {"CPU_BOUND_WORK": str(n)}
    rates: dict[int, float] = {}
    cpu_use: dict[int, tuple[float, float]] = {}
    for cores in (1, 2):
        proc, port = start(args.python, "cpu_bound:app", HERE, "--cores", str(cores), "--isolation", args.isolation,
                           env=env, log=tmp / f"cpu-{cores}.log")
        try:
            wrk(port, 2)  # warm-up
            server0, busy0, t0 = tree_cpu_ticks(proc.pid), machine_busy_ticks(), time.monotonic()
            rates[cores] = wrk(port, args.duration)
            elapsed = time.monotonic() - t0
            tick = os.sysconf("SC_CLK_TCK")
            server_cpus = (tree_cpu_ticks(proc.pid) - server0) / tick / elapsed
            other_cpus = (machine_busy_ticks() - busy0) / tick / elapsed - server_cpus
            cpu_use[cores] = (server_cpus, other_cpus)
        finally:
            assert stop(proc) == 0, (tmp / f"cpu-{cores}.log").read_text()
    ratio = rates[2] / rates[1]

    rss: dict[int, int] = {}
    chosen = ""
    for cores in (1, 2, 3):
        log = tmp / f"rss-{cores}.log"
        proc, port = start(args.python, args.rss_app, Path(args.rss_app_dir), "--cores", str(cores),
                           "--isolation", args.isolation, log=log)
        try:
            wrk(port, 2)  # touch the request path in every pair
            time.sleep(0.5)
            rss[cores] = tree_rss_kib(proc.pid)
            m = re.search(r"isolation (\w+) \(", log.read_text())
            chosen = m.group(1) if m else chosen
        finally:
            assert stop(proc) == 0, log.read_text()

    today = dt.date.today().isoformat()
    note = ROOT / "bench" / "results" / f"{today}-cores-scaling.md"
    cmd = " ".join(["python", "bench/cores/cpu_bound.py", "--python", args.python, "--isolation", args.isolation,
                    "--duration", str(args.duration), "--rss-app", args.rss_app, "--rss-app-dir",
                    args.rss_app_dir.replace(str(ROOT) + "/", "")] + (["--append"] if args.append else []))
    section = [
        f"## CPython {version}, isolation {args.isolation}",
        "",
        f"Command: `{cmd}`  ",
        f"Date: {dt.datetime.now().isoformat(timespec='seconds')}  ",
        f"Work per request: {n} loop iterations = {ms:.2f} ms of pure-Python CPU (process time, mean of 40, "
        "calibrated on this Python)  ",
        f"Load: `wrk -t2 -c16 -d{args.duration}s` after a 2 s warm-up, on the same machine",
        "",
        "| pairs | requests/s | CPUs used by the server | CPUs used by everything else (wrk, other work on the machine) |",
        "|---|---|---|---|",
        f"| `--cores 1` | {rates[1]:.1f} | {cpu_use[1][0]:.2f} | {cpu_use[1][1]:.2f} |",
        f"| `--cores 2` | {rates[2]:.1f} | {cpu_use[2][0]:.2f} | {cpu_use[2][1]:.2f} |",
        "",
        f"Scaling 1 → 2 pairs: **{ratio:.2f}×** (target ≥ 1.7×).",
        "",
        f"Memory, `{args.rss_app}` from `{args.rss_app_dir.replace(str(ROOT) + '/', '')}` with `--isolation "
        f"{args.isolation}`" + (f" (ran as {chosen})" if chosen and chosen != args.isolation else "")
        + ": RSS of the process tree (every process, every interpreter) after a 2 s load",
        "",
        "| pairs | RSS (MiB) |",
        "|---|---|",
        f"| 1 | {rss[1] / 1024:.1f} |",
        f"| 2 | {rss[2] / 1024:.1f} |",
        f"| 3 | {rss[3] / 1024:.1f} |",
        "",
        f"RSS per extra pair: **{(rss[2] - rss[1]) / 1024:.1f} MiB** from 1 to 2 pairs, "
        f"**{(rss[3] - rss[2]) / 1024:.1f} MiB** from 2 to 3 (3 pairs on 2 CPUs: memory only).",
        "",
    ]
    if args.append and note.exists():
        text = note.read_text() + "\n" + "\n".join(section)
    else:
        text = "\n".join([
            "# Every core: CPU-bound scaling and memory per pair",
            "",
            f"Machine: {machine()}. One run each, both pair counts in the same invocation;",
            "the load generator shares the machine (wrk needs little CPU at these rates).",
            "",
            *section,
        ])
    note.write_text(text)
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
