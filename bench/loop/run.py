#!/usr/bin/env python3
"""Loop benchmarks, side by side: cadeloop.Loop vs asyncio's selector loop vs uvloop.

Every sample is a fresh process (`workloads.py LOOP WORKLOAD`), pinned to one
CPU, and the loops take turns in a rotating order (run r starts with loop
r mod 3), so drift in machine load spreads over all of them. The table holds
the median of --runs samples per loop (operations per CPU second of the
process, from /proc/PID/stat, and per wall-clock second) and the ratios
cadeloop/uvloop and cadeloop/asyncio, and goes to bench/results/ with the command, the machine
and the load average before and after.

    .venv/bin/python -m pip install -r bench/loop/requirements.txt   # uvloop
    .venv/bin/python bench/loop/run.py [--runs 5] [--cpu 1] [--only WORKLOAD ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from workloads import WORKLOADS  # noqa: E402

LOOPS = ["asyncio", "cadeloop", "uvloop"]
SCHEDULING = [w for w in WORKLOADS if not w.startswith(("tcp_", "udp_"))]
# What issue 3 asks of cadeloop: (minimum ratio to uvloop, minimum ratio to asyncio).
TARGETS: dict[str, tuple[float, float]] = {w: (1.0, 0.0) for w in SCHEDULING}
TARGETS.update({"call_soon_chain": (1.0, 2.0), "timer_schedule_cancel": (1.0, 2.0), "timer_fire": (1.0, 2.0)})
TARGETS.update({"tcp_echo_1k_1conn": (1.0, 0.0), "tcp_echo_1k_64conn": (1.0, 0.0), "tcp_echo_64k_8conn": (0.0, 0.0)})
# Issue 15: cross-thread wake-ups at 2x uvloop, a task tree at 1.2x, TCP echo at 1.2x, UDP echo and every
# other workload at least uvloop's (tcp_accept_churn_64_pyaccept is a comparison row: cadeloop put back on
# asyncio's Python accept path, which no program takes).
TARGETS.update({"threadsafe_throughput": (2.0, 0.0), "task_fib": (1.2, 0.0), "udp_echo_256b_8ep": (1.0, 0.0)})
TARGETS.update({"tcp_echo_1k_1conn": (1.2, 0.0), "tcp_echo_1k_64conn": (1.2, 0.0), "tcp_echo_64k_8conn": (1.0, 0.0)})
TARGETS.update({w: (1.0, 0.0) for w in WORKLOADS if w not in TARGETS and not w.endswith("_pyaccept")})


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def sample(loop: str, workload: str, cpu: int | None) -> tuple[float, float]:
    cmd = [sys.executable, str(HERE / "workloads.py"), loop, workload]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{loop} {workload} failed:\n{out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Operations per CPU second of the process (all its threads, /proc/PID/stat);
    # the wall-clock rate when the run was too short to register CPU ticks.
    return float(got["value"]), float(got.get("per_cpu_second") or got["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="samples per loop and workload (fresh processes)")
    ap.add_argument("--cpu", type=int, default=1, help="CPU to pin every sample to (-1: no pinning)")
    ap.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    ap.add_argument("--out", help="markdown file to write (default: bench/results/loop-<date>-py<ver>.md)")
    args = ap.parse_args()
    cpu = None if args.cpu < 0 else args.cpu
    names = args.only or list(WORKLOADS)
    command = " ".join(["python", *sys.argv])
    started = datetime.datetime.now().astimezone()
    load_before = loadavg()
    medians: dict[str, dict[str, float]] = {}  # by CPU time: what the targets are judged on
    wall_medians: dict[str, dict[str, float]] = {}
    for name in names:
        samples: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        wall_samples: dict[str, list[float]] = {loop: [] for loop in LOOPS}
        for r in range(args.runs):
            order = LOOPS[r % len(LOOPS):] + LOOPS[: r % len(LOOPS)]
            for loop in order:
                wall, per_cpu = sample(loop, name, cpu)
                wall_samples[loop].append(wall)
                samples[loop].append(per_cpu)
        medians[name] = {loop: statistics.median(v) for loop, v in samples.items()}
        wall_medians[name] = {loop: statistics.median(v) for loop, v in wall_samples.items()}
        m, w = medians[name], wall_medians[name]
        print(
            f"{name:<24} per CPU s: " + " ".join(f"{loop}={m[loop]:>12,.0f}" for loop in LOOPS)
            + f"  cadeloop/uvloop={m['cadeloop'] / m['uvloop']:.2f} cadeloop/asyncio={m['cadeloop'] / m['asyncio']:.2f}"
            + f"  (wall: cadeloop/uvloop={w['cadeloop'] / w['uvloop']:.2f})",
            flush=True,
        )
    load_after = loadavg()
    info = machine()
    lines = [
        f"# cadeloop.Loop benchmarks, {started:%Y-%m-%d %H:%M %Z}",
        "",
        f"- command: `{command}` (from the repository root)",
        f"- machine: {info['cpu']}, {info['cpus']} CPUs, Linux {info['kernel']}; {info['python']}",
        f"- pinned to CPU {cpu}" if cpu is not None else "- not pinned",
        f"- load average (1/5/15 min) before: {load_before}; after: {load_after}",
        f"- median of {args.runs} runs per loop, each a fresh process; loops in rotating order",
        "- first table: operations per CPU second of the benchmark process (utime + stime of all its"
        " threads from /proc/PID/stat over the timed part; targets are judged on these); second table:"
        " operations per wall-clock second (counts the time other processes had the CPU)",
        "- TCP echo: protocol-based (asyncio.Protocol on both ends, no streams); server and clients"
        " on the same loop in one process; round trips per second",
        "- UDP echo: asyncio.DatagramProtocol on both ends (8 connected client endpoints, 256-byte"
        " datagrams, the server replies with sendto(data, addr)); one loop, one process",
        "",
        "| workload | unit | asyncio | uvloop | cadeloop | cadeloop / uvloop | cadeloop / asyncio | target |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in names:
        m = medians[name]
        vs_uv, vs_aio = m["cadeloop"] / m["uvloop"], m["cadeloop"] / m["asyncio"]
        need_uv, need_aio = TARGETS.get(name, (0.0, 0.0))
        wants = []
        if need_uv:
            wants.append(f"≥{need_uv:g}× uvloop")
        if need_aio:
            wants.append(f"≥{need_aio:g}× asyncio")
        met = vs_uv >= need_uv and vs_aio >= need_aio
        target = ("met: " if met else "**NOT met**: ") + ", ".join(wants) if wants else "—"
        lines.append(
            f"| {name} | {WORKLOADS[name][1]} | {m['asyncio']:,.0f} | {m['uvloop']:,.0f} | {m['cadeloop']:,.0f}"
            f" | {vs_uv:.2f} | {vs_aio:.2f} | {target} |"
        )
    lines += [
        "",
        "Wall clock (operations per second of elapsed time, same runs):",
        "",
        "| workload | unit | asyncio | uvloop | cadeloop | cadeloop / uvloop | cadeloop / asyncio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        w = wall_medians[name]
        lines.append(
            f"| {name} | {WORKLOADS[name][1]} | {w['asyncio']:,.0f} | {w['uvloop']:,.0f} | {w['cadeloop']:,.0f}"
            f" | {w['cadeloop'] / w['uvloop']:.2f} | {w['cadeloop'] / w['asyncio']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / (
        f"loop-{started:%Y%m%d-%H%M}-py{sys.version_info[0]}{sys.version_info[1]}.md"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
