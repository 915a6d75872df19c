"""What the side-by-side drivers share (bench/http/driver.py, bench/ws/driver.py, bench/tls/driver.py).

A server's CPU time is utime+stime of its whole process tree from /proc/PID/stat; steal is read per CPU
from /proc/stat; each server starts pinned to one CPU (`taskset -c`) in its own session, and is stopped
with its whole process group. The peers live in venvs under build/bench-peers/.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "build" / "bench-peers"
RESULTS = ROOT / "bench" / "results"
TOOLS = ROOT / "build" / "bench-tools"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def setup_peers(packages: dict[str, list[str]], python: str) -> None:
    """Each peer's venv (made with `python` when missing) with its pinned packages; one line a peer."""
    for name, pins in packages.items():
        venv = PEERS / name
        if not (venv / "bin/python").exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        r = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *pins])
        print(f"setup: {name}: {'ok' if r.returncode == 0 else 'FAILED'} ({' '.join(pins)})")


def tree_pids(root: int) -> list[int]:
    """root and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def steal_seconds(cpu: int) -> float:
    """Time the hypervisor ran something else while CPU `cpu` had work (the 8th field of its /proc/stat line)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return int(line.split()[8]) / CLK_TCK
    return 0.0


def cpu_seconds(root: int) -> float:
    """utime+stime (and reaped children's) of the whole process tree, from /proc/PID/stat."""
    total = 0
    for pid in tree_pids(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the comm field: state=0 ... utime=11 stime=12 cutime=13 cstime=14
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / CLK_TCK


def machine() -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0, tls: ssl.SSLContext | None = None,
              connect_timeout: float = 0.5) -> bool:
    """Whether the server answers a GET / with 200 within `timeout` (over TLS with `tls`; False at once if it
    exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=connect_timeout) as raw:
                with tls.wrap_socket(raw) if tls is not None else raw as s:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return True
        except OSError:
            time.sleep(0.1)
    return False


def pinned(cpu: int, argv: list[str], nice: int = 0) -> list[str]:
    """argv confined to CPU `cpu` (`taskset -c`), under `nice -n` when `nice` is not 0."""
    argv = ["taskset", "-c", str(cpu), *argv]
    return ["nice", "-n", str(nice), *argv] if nice else argv


def start_server(argv: list[str], app_dir: Path, ready: Callable[[subprocess.Popen], bool]
                 ) -> tuple[subprocess.Popen, str]:
    """Starts `argv` in `app_dir` (also its PYTHONPATH), in a session of its own, and waits for `ready`;
    returns the process and "" or why it did not start (the process is stopped then)."""
    # The benchmarks' own knobs (CADELOOP_BENCH_*) are not the server's settings: cadeloop refuses
    # an unknown CADELOOP_* variable, so they stay with the driver.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CADELOOP_BENCH_")}
    proc = subprocess.Popen(argv, cwd=app_dir, env=dict(env, PYTHONPATH=str(app_dir)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if ready(proc):
        return proc, ""
    err = proc.stderr.read().decode(errors="replace")[-400:] if proc.poll() is not None else "no answer"
    stop_server(proc)
    return proc, f"did not start: {err.strip()}"


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group; SIGKILL if it has not exited 15 s later."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def write_results(stem: Path, lines: list[str], data: dict) -> Path:
    """The report: `lines` as stem.md, `data` (command, machine, date, figures) as stem.json; the .md path."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    return stem.with_suffix(".md")
