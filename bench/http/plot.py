#!/usr/bin/env python3
"""Draws a driver.py result (bench/results/*.json) as PNG charts for the docs.

    python bench/http/plot.py bench/results/2026-12-01-http-suite.json docs/img/
        # the suite: one chart per group into the folder: suite-rps.png, suite-cpu.png,
        # suite-latency.png, suite-memory.png, suite-timers.png
    python bench/http/plot.py bench/results/2026-12-01-http-suite.json --table
        # the same medians as Markdown tables (for docs/benchmarks.md)
    python bench/http/plot.py bench/results/2026-11-30-http-servers.json docs/img/http-servers.png
        # one picture: req/s and CPU per request (or, for a --rounds run, req/s round by round)

Each figure of the suite charts is the median over the run's rounds of a server's runs whose CPU steal
stayed under 3 % on both CPUs (all its runs when none did). Needs matplotlib: the driver's --setup makes
a venv with it, build/bench-peers/plot/bin/python.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

QUIET_STEAL = 0.03


def medians(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(workload, server) -> median rps, cpu, p50, p99 over the quiet runs (or all runs)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if r["rps"]:
            groups.setdefault((r["workload"], r["server"]), []).append(r)
    out = {}
    for key, runs in groups.items():
        quiet = [r for r in runs if max(r["extra"].get("steal_share", 0), r["extra"].get("load_steal_share", 0))
                 < QUIET_STEAL] or runs
        out[key] = {k: statistics.median(r[k] for r in quiet) for k in ("rps", "cpu_us_per_request", "p50_us",
                                                                         "p99_us")}
        out[key]["runs"] = f"{len(quiet)}/{len(runs)}"
    return out


def short(server: str) -> str:
    """A chart label: the server's name, with the parenthesis kept only where two servers share the name."""
    if server.startswith("uvicorn"):
        return server.replace("(", "").replace(")", "")
    return server.split(" (")[0]


def suite(data: dict, folder: Path) -> None:
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    m = medians(data["results"])
    workloads = list(dict.fromkeys(w for w, _ in m))
    servers = list(dict.fromkeys(r["server"] for r in data["results"]))
    colors = {s: plt.get_cmap("tab10")(i) for i, s in enumerate(servers)}
    subtitle = f"{data['date']} · {data['machine']} · median of rounds"

    def grid(key: str, label: str, name: str, scale: float = 1.0, fmt: str = "{:.0f}") -> None:
        cols = 5
        rows = (len(workloads) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.0 * rows + 0.9), squeeze=False)
        for ax in axes.flat[len(workloads):]:
            ax.axis("off")
        for ax, w in zip(axes.flat, workloads):
            names = [s for s in servers if (w, s) in m]
            values = [m[(w, s)][key] / scale for s in names]
            bars = ax.barh(range(len(names)), values, color=[colors[s] for s in names])
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels([short(s) for s in names], fontsize=7)
            ax.invert_yaxis()
            ax.set_title(w.replace(", ", "\n", 1), fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
            ax.grid(axis="x", alpha=0.3)
            for b, v in zip(bars, values):
                ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt.format(v), va="center", fontsize=6)
            ax.set_xlim(0, max(values) * 1.3 if values else 1)
        fig.suptitle(f"{label}\n{subtitle}", fontsize=9)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        print(f"written: {folder / name}")

    grid("rps", "requests per second, thousands (higher is better)", "suite-rps.png", 1000, "{:.1f}")
    grid("cpu_us_per_request", "server CPU µs per request, all threads and processes (lower is better)",
         "suite-cpu.png", 1, "{:.1f}")
    grid("p50_us", "median latency, ms (lower is better; open loop: from when each request was due)",
         "suite-p50.png", 1000, "{:.3g}")
    grid("p99_us", "p99 latency, ms (lower is better; open loop: from when each request was due)",
         "suite-p99.png", 1000, "{:.3g}")

    idle = {k: v for k, v in data.get("idle", {}).items() if "levels" in v}
    if idle:
        levels = sorted({lv["connections"] for v in idle.values() for lv in v["levels"]})
        fig, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 3.4), squeeze=False)
        for ax, n in zip(axes[0], levels):
            names, values, hues = [], [], []
            for s, v in idle.items():
                lv = next((lv for lv in v["levels"] if lv["connections"] == n), None)
                if lv and lv["per_connection_kib"] is not None:
                    names.append(short(s) + ("" if lv["held"] == n else f" ({lv['held']} held)"))
                    values.append(lv["per_connection_kib"])
                    hues.append(colors.get(s, "grey"))
            bars = ax.barh(range(len(names)), values, color=hues)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=7)
            ax.invert_yaxis()
            for b, v in zip(bars, values):
                ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:.1f}", va="center", fontsize=7)
            ax.set_xlim(0, max(values + [1]) * 1.3)
            ax.set_title(f"unique memory per idle keep-alive connection, KiB, at {n:,}", fontsize=8)
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle(subtitle, fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / "suite-memory.png", dpi=100)
        plt.close(fig)
        print(f"written: {folder / 'suite-memory.png'}")

    timers = {k: v for k, v in data.get("timers", {}).items() if "wakeup_p50_us" in v}
    if timers:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.0))
        names = list(timers)
        for ax, (key, title) in zip(axes, (("sleep_1ms_late", "how late asyncio.sleep(1 ms) returns, µs"),
                                           ("wakeup", "call_soon_threadsafe() to a waiting loop, µs"))):
            p50 = [timers[n][f"{key}_p50_us"] for n in names]
            p99 = [timers[n][f"{key}_p99_us"] for n in names]
            ys = range(len(names))
            ax.barh([y - 0.2 for y in ys], p50, 0.4, label="p50")
            ax.barh([y + 0.2 for y in ys], p99, 0.4, label="p99")
            ax.set_yticks(list(ys))
            ax.set_yticklabels(names, fontsize=7)
            ax.invert_yaxis()
            ax.set_title(title, fontsize=8)
            ax.legend(fontsize=7)
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle(subtitle, fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / "suite-timers.png", dpi=100)
        plt.close(fig)
        print(f"written: {folder / 'suite-timers.png'}")


def single(data: dict, out: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    results = [r for r in data["results"] if r["rps"]]
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    servers = list(dict.fromkeys(r["server"] for r in results))
    if any("round" in r["extra"] for r in results):
        fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 3.6), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for s in servers:
                runs = [r for r in results if r["workload"] == w and r["server"] == s]
                ax.plot([r["extra"]["round"] + 1 for r in runs], [r["rps"] / 1000 for r in runs],
                        marker="o", markersize=3, label=s)
            ax.set_title(w, fontsize=10)
            ax.set_xlabel("round")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_ylabel("thousand requests/s")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        width = 0.8 / len(servers)
        for k, (ax, key, label) in enumerate(zip(
                axes, ("rps", "cpu_us_per_request"), ("thousand requests/s", "server CPU µs per request"))):
            for i, s in enumerate(servers):
                xs, ys = [], []
                for j, w in enumerate(workloads):
                    r = next((r for r in results if r["workload"] == w and r["server"] == s), None)
                    if r:
                        xs.append(j + i * width)
                        ys.append(r[key] / 1000 if key == "rps" else r[key])
                ax.bar(xs, ys, width, label=s)
            ax.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(workloads))])
            ax.set_xticklabels([w.replace(", ", "\n") for w in workloads], fontsize=8)
            ax.set_ylabel(label)
            ax.grid(axis="y", alpha=0.3)
            if k == 0:
                ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n{data['machine']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"written: {out}")


def fmt_rps(v: float) -> str:
    return f"{v / 1000:.1f} K" if v >= 1000 else f"{v:.0f}"


def fmt_ms(us: float) -> str:
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.0f} µs"


def table(data: dict) -> str:
    """The suite's medians as Markdown: one table per figure (req/s, CPU/request, p50, p99), workloads down,
    servers across; the ratio row of cadeloop to the Rust cadeloop and to the C floor below the tables."""
    m = medians(data["results"])
    workloads = list(dict.fromkeys(w for w, _ in m))
    servers = list(dict.fromkeys(r["server"] for r in data["results"]))
    out = []
    for key, title, fmt in (("rps", "requests per second", fmt_rps),
                            ("cpu_us_per_request", "server CPU µs per request", lambda v: f"{v:.1f}"),
                            ("p50_us", "median latency", fmt_ms), ("p99_us", "p99 latency", fmt_ms)):
        out += [f"**{title}**", "", "| workload | " + " | ".join(short(s) for s in servers) + " |",
                "|---|" + "---:|" * len(servers)]
        for w in workloads:
            out.append(f"| {w} | " + " | ".join(fmt(m[(w, s)][key]) if (w, s) in m else "–" for s in servers) + " |")
        out.append("")
    rs = next((s for s in servers if s.startswith("cadeloop-rs")), None)
    floor = next((s for s in servers if s.startswith("C floor")), None)
    if rs and "cadeloop" in servers:
        out += ["**cadeloop against the Rust cadeloop** (req/s ratio, CPU/request ratio, p50 ratio; "
                "≥ 1, ≤ 1, ≤ 1 meet issue 16)", "", "| workload | req/s | CPU/request | p50 | p99 |",
                "|---|---:|---:|---:|---:|"]
        for w in workloads:
            a, b = m.get((w, "cadeloop")), m.get((w, rs))
            if a and b:
                out.append(f"| {w} | {a['rps'] / b['rps']:.2f} | {a['cpu_us_per_request'] / b['cpu_us_per_request']:.2f}"
                           f" | {a['p50_us'] / b['p50_us']:.2f} | {a['p99_us'] / b['p99_us']:.2f} |")
        out.append("")
    if floor and "cadeloop" in servers:
        out += ["**cadeloop's CPU per request against the C floor**", "", "| workload | ratio |", "|---|---:|"]
        for w in workloads:
            a, b = m.get((w, "cadeloop")), m.get((w, floor))
            if a and b:
                out.append(f"| {w} | {a['cpu_us_per_request'] / b['cpu_us_per_request']:.2f} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: plot.py RESULT.json OUT.png|FOLDER/|--table", file=sys.stderr)
        return 2
    if sys.argv[2] == "--table":
        print(table(json.loads(Path(sys.argv[1]).read_text())))
        return 0
    import matplotlib

    matplotlib.use("Agg")
    data = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    if out.suffix == ".png":
        single(data, out, Path(sys.argv[1]).stem)
    else:
        suite(data, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
