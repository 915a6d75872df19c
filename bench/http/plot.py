#!/usr/bin/env python3
"""Draws a driver.py result (bench/results/*.json) as PNG charts for the docs.

    python bench/http/plot.py bench/results/2026-12-01-http-suite.json docs/img/
        # the suite: one chart per group into the folder: suite-rps.png, suite-cpu.png,
        # suite-latency.png, suite-memory.png, suite-timers.png
    python bench/http/plot.py bench/results/2026-12-01-http-suite.json --table
        # the same medians as Markdown tables (for docs/benchmarks.md)
    python bench/http/plot.py bench/results/2026-12-01-ws-ws-servers-quiet.json \
        bench/results/2026-12-01-ws-ws-uvicorn-quiet.json bench/results/2026-12-01-tls-servers-quiet.md docs/img/
        # the WebSocket and TLS rows from their own drivers' results: suite-ws.png, suite-tls.png
    python bench/http/plot.py bench/results/2026-11-30-http-servers.json docs/img/http-servers.png
        # one picture: req/s and CPU per request (or, for a --rounds run, req/s round by round)

A results file is told by what it holds: bench/ws/driver.py's JSON (messages per second), bench/tls/driver.py's
JSON or, for a run older than its JSON, its Markdown (the median run's row of each server and workload), or
bench/http/driver.py's JSON; a suite run's JSON holds its WebSocket and TLS results too ("ws", "tls"). A
server measured in more than one WebSocket or TLS file is drawn from the first file that measured it.

Each figure of the HTTP and WebSocket charts is the median over the run's rounds of a server's runs whose
CPU steal stayed under 3 % on both CPUs (all its runs when none did); the TLS charts show, as
bench/tls/driver.py's table does, each server's run with the median CPU per request (and that run's
req/s). Needs matplotlib: the driver's --setup makes a venv with it, build/bench-peers/plot/bin/python.
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


def family(server: str) -> int | None:
    """The suite's servers in bench/http/driver.py's SUITE_SERVERS order (the HTTP, WebSocket and TLS
    drivers name them differently): the same colour for the same server in every chart."""
    s = server.lower()
    for i, test in enumerate((lambda: s.startswith("cadeloop-rs"), lambda: s.startswith("cadeloop"),
                              lambda: s.startswith("uvicorn") and "h11" not in s,
                              lambda: s.startswith("uvicorn"), lambda: s.startswith("granian"),
                              lambda: s.startswith("hypercorn"), lambda: s.startswith("c floor"))):
        if test():
            return i
    return None


def palette(servers: list[str]) -> dict:
    import matplotlib.pyplot as plt

    known = {s: family(s) for s in servers}
    spare = (i for i in range(10) if i not in known.values())
    return {s: plt.get_cmap("tab10")(i if i is not None else next(spare, 9)) for s, i in known.items()}


def bar_panel(ax, labels: list[str], values: list[float], hues: list, fmt: str, title: str) -> None:
    """One workload's horizontal bars, one per server, each with its figure written at its end."""
    bars = ax.barh(range(len(labels)), values, color=hues)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    for b, v in zip(bars, values):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt.format(v), va="center", fontsize=6)
    ax.set_xlim(0, max(values) * 1.3 if values else 1)


def suite(data: dict, folder: Path) -> None:
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    m = medians(data["results"])
    workloads = list(dict.fromkeys(w for w, _ in m))
    servers = list(dict.fromkeys(r["server"] for r in data["results"]))
    colors = palette(servers)
    subtitle = f"{data['date']} · {data['machine']} · median of rounds"

    def grid(key: str, label: str, name: str, scale: float = 1.0, fmt: str = "{:.0f}") -> None:
        cols = 5
        rows = (len(workloads) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.0 * rows + 0.9), squeeze=False)
        for ax in axes.flat[len(workloads):]:
            ax.axis("off")
        for ax, w in zip(axes.flat, workloads):
            names = [s for s in servers if (w, s) in m]
            bar_panel(ax, [short(s) for s in names], [m[(w, s)][key] / scale for s in names],
                      [colors[s] for s in names], fmt, w.replace(", ", "\n", 1))
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


def kind(data: dict) -> str:
    """"ws", "tls" or "http": which driver wrote this results file."""
    if data.get("kind") == "tls":
        return "tls"
    return "ws" if any("msgs_per_s" in r for r in data.get("results", [])) else "http"


def tls_markdown(path: Path) -> dict:
    """bench/tls/driver.py's Markdown (a run older than its JSON): the table's row of each server and workload
    (the run with the median CPU per request) as that server's only run, with the header's command, machine
    and date."""
    text = path.read_text()
    head = {k: v.strip() for k, v in
            (line.split(":", 1) for line in text.splitlines() if line.split(":", 1)[0] in ("Command", "Machine",
                                                                                         "Date"))}
    results = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[2].replace(".", "").isdigit():
            results.append({"server": cells[0], "workload": cells[1], "rps": float(cells[2]),
                            "cpu_us_per_request": float(cells[3]), "p50_us": float(cells[4]),
                            "p99_us": float(cells[5]), "errors": int(cells[6] or 0)})
    if not results:
        raise SystemExit(f"plot.py: {path}: no bench/tls/driver.py table in it")
    return {"kind": "tls", "command": head.get("Command", "").strip("` "), "machine": head.get("Machine", ""),
            "date": head.get("Date", "").split(";")[0], "results": results}


def load(path: Path) -> dict:
    data = tls_markdown(path) if path.suffix == ".md" else json.loads(path.read_text())
    data.setdefault("file", str(path))
    return data


def ws_medians(data: dict) -> dict[tuple[str, str], dict]:
    """(workload, server) -> median messages/s, CPU µs per message, p50, p99 over the quiet rounds (or all)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in data["results"]:
        if r["messages"]:
            groups.setdefault((r["workload"], r["server"]), []).append(r)
    out = {}
    for key, runs in groups.items():
        quiet = [r for r in runs if max(r["steal_share"], r["load_steal_share"]) < QUIET_STEAL] or runs
        out[key] = {k: statistics.median(r[k] for r in quiet) for k in ("msgs_per_s", "cpu_us_per_message",
                                                                         "p50_us", "p99_us")}
        out[key]["runs"] = f"{len(quiet)}/{len(runs)}"
    return out


def tls_medians(data: dict) -> dict[tuple[str, str], dict]:
    """(workload, server) -> the run with the median CPU per request, as bench/tls/driver.py's table has it."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in data["results"]:
        if r["rps"]:
            groups.setdefault((r["workload"], r["server"]), []).append(r)
    return {key: sorted(runs, key=lambda r: r["cpu_us_per_request"])[len(runs) // 2] for key, runs in groups.items()}


def merged(datas: list[dict], figures) -> tuple[dict, list[str], list[str], list[str]]:
    """Several files' figures in one: a server from the first file that measured it (per workload). Returns
    the figures, the workloads, the servers (in the HTTP suite's order) and one line per file saying what it
    gave."""
    m: dict[tuple[str, str], dict] = {}
    sources = []
    for data in datas:
        taken = set()
        for key, v in figures(data).items():
            if key not in m:
                m[key] = v
                taken.add(key[1])
        if taken:
            servers = [s for s in dict.fromkeys(r["server"] for r in data["results"]) if s in taken]
            when = str(data["date"])[:16].replace("T", " ")
            sources.append(f"{data['file']} ({', '.join(short(s) for s in servers)}; {when} UTC)")
    workloads = list(dict.fromkeys(w for w, _ in m))
    servers = sorted(dict.fromkeys(s for _, s in m), key=lambda s: 99 if family(s) is None else family(s))
    return m, workloads, servers, sources


def rows_chart(m: dict, workloads: list[str], servers: list[str], rows: list[tuple[str, str, float, str]],
               title: str, note: str, out: Path) -> None:
    """One figure: a row of panels per figure in `rows` (key, axis label, scale, format), a panel per
    workload, in the style of the HTTP charts."""
    import matplotlib.pyplot as plt

    colors = palette(servers)
    cols = len(workloads)
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.3 * max(cols, 3), 3.0 * len(rows) + 1.1), squeeze=False)
    for row, (key, label, scale, fmt) in zip(axes, rows):
        for ax, w in zip(row, workloads):
            names = [s for s in servers if (w, s) in m and m[(w, s)][key] == m[(w, s)][key]]
            bar_panel(ax, [short(s).split(", ")[0] for s in names], [m[(w, s)][key] / scale for s in names],
                      [colors[s] for s in names], fmt, w.replace(", ", "\n", 1))
            ax.set_xlabel(label, fontsize=7)
    fig.suptitle(f"{title}\n{note}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"written: {out}")


def ws_chart(datas: list[dict], folder: Path) -> None:
    m, workloads, servers, sources = merged(datas, ws_medians)
    folder.mkdir(parents=True, exist_ok=True)
    rows_chart(m, workloads, servers, [
        ("msgs_per_s", "thousand messages/s (higher is better)", 1000, "{:.1f}"),
        ("cpu_us_per_message", "server CPU µs/message (lower is better)", 1, "{:.2f}")],
        "WebSocket (bench/ws/driver.py), median of rounds",
        f"{datas[0]['machine']}\n" + "\n".join(sources), folder / "suite-ws.png")


def tls_chart(datas: list[dict], folder: Path) -> None:
    m, workloads, servers, sources = merged(datas, tls_medians)
    folder.mkdir(parents=True, exist_ok=True)
    rows_chart(m, workloads, servers, [
        ("rps", "thousand requests/s (higher is better)", 1000, "{:.2f}"),
        ("cpu_us_per_request", "server CPU µs/request (lower is better)", 1, "{:.1f}")],
        "HTTPS, TLS 1.3 (bench/tls/driver.py), the run with the median CPU per request",
        f"{datas[0]['machine']}\n" + "\n".join(sources), folder / "suite-tls.png")


def rows_table(datas: list[dict], figures, columns: list[tuple[str, str, object]]) -> str:
    m, workloads, servers, sources = merged(datas, figures)
    out = ["from " + "; ".join(sources), ""]
    for key, title, fmt in columns:
        out += [f"**{title}**", "", "| workload | " + " | ".join(short(s).split(", ")[0] for s in servers) + " |",
                "|---|" + "---:|" * len(servers)]
        for w in workloads:
            out.append(f"| {w} | " + " | ".join(fmt(m[(w, s)][key]) if (w, s) in m else "–" for s in servers) + " |")
        out.append("")
    return "\n".join(out)


def ws_table(datas: list[dict]) -> str:
    return rows_table(datas, ws_medians, [("msgs_per_s", "WebSocket messages per second", fmt_rps),
                                          ("cpu_us_per_message", "server CPU µs per message", lambda v: f"{v:.2f}")])


def tls_table(datas: list[dict]) -> str:
    return rows_table(datas, tls_medians, [("rps", "HTTPS requests per second", fmt_rps),
                                           ("cpu_us_per_request", "server CPU µs per request", lambda v: f"{v:.1f}")])


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


def ratios(datas: list[dict], out: Path) -> None:
    """Every server's median req/s and CPU per request over the first server's (the reference, drawn as
    1.0), per workload, from one or more HTTP results files of the same servers: where a server stands
    against a peer at a glance."""
    import matplotlib.pyplot as plt

    # A workload's bars come from the last file that ran it, each against that file's own reference run;
    # the C floor is a reference of another kind (its ratios are in the tables), not drawn.
    m: dict[tuple[str, str], dict] = {}
    for d in datas:
        ran = {r["workload"] for r in d["results"] if r["rps"]}
        m = {k: v for k, v in m.items() if k[0] not in ran} | medians(d["results"])
    results = [r for d in datas for r in d["results"] if r["rps"] and not r["server"].startswith("C floor")]
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    servers = list(dict.fromkeys(r["server"] for r in results))
    ref, others = servers[0], servers[1:]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / max(1, len(others))
    for ax, key, label in zip(axes, ("rps", "cpu_us_per_request"),
                              (f"req/s over {short(ref)}'s (higher is better)",
                               f"CPU per request over {short(ref)}'s (lower is better)")):
        for i, s in enumerate(others):
            xs, ys = [], []
            for j, w in enumerate(workloads):
                a, b = m.get((w, s)), m.get((w, ref))
                if a and b and b[key]:
                    xs.append(j + i * width)
                    ys.append(a[key] / b[key])
            bars = ax.bar(xs, ys, width, label=short(s))
            ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(others) - 1) / 2 for j in range(len(workloads))])
        ax.set_xticklabels([w.replace(" connections", " conns").replace(", ", "\n") for w in workloads],
                           fontsize=7, rotation=30, ha="right")
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(0, max(1.5, ax.get_ylim()[1] * 1.15))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper center", ncol=len(others))
    names = ", ".join(sorted({d.get("file", "?") for d in datas}))
    fig.suptitle(f"against {ref}: {names}\n{datas[0]['machine']}", fontsize=8)
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
        out += [f"**{title}**", "", "| workload | " + " | ".join(short(s).split(", ")[0] for s in servers) + " |",
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
    if len(sys.argv) < 3:
        print("usage: plot.py RESULT [RESULT ...] FOLDER/|--table, plot.py RESULT.json OUT.png, or "
              "plot.py --ratios RESULT.json [RESULT.json ...] OUT.png", file=sys.stderr)
        return 2
    if sys.argv[1] == "--ratios":
        import matplotlib

        matplotlib.use("Agg")
        ratios([load(Path(a)) | {"file": Path(a).stem} for a in sys.argv[2:-1]], Path(sys.argv[-1]))
        return 0
    paths, out = [Path(a) for a in sys.argv[1:-1]], sys.argv[-1]
    datas = [load(p) for p in paths]
    https = [d for d in datas if kind(d) == "http"]
    if len(https) > 1:
        print("plot.py: one HTTP results file at a time", file=sys.stderr)
        return 2
    # A suite run's JSON carries its WebSocket and TLS results; files named after it come after them.
    ws = [d | {"file": d.get("file", "?")} for h in https if "results" in h.get("ws", {}) for d in [h["ws"]]]
    tls = [d | {"file": d.get("file", "?")} for h in https if "results" in h.get("tls", {}) for d in [h["tls"]]]
    ws += [d for d in datas if kind(d) == "ws"]
    tls += [d for d in datas if kind(d) == "tls"]
    if out == "--table":
        print("\n".join(part for part in (table(https[0]) if https else "", ws_table(ws) if ws else "",
                                          tls_table(tls) if tls else "") if part))
        return 0
    import matplotlib

    matplotlib.use("Agg")
    target = Path(out)
    if target.suffix == ".png":
        if len(https) != 1 or len(datas) != 1:
            print("plot.py: one picture is drawn from one HTTP results file", file=sys.stderr)
            return 2
        single(https[0], target, paths[0].stem)
        return 0
    if https:
        suite(https[0], target)
    if ws:
        ws_chart(ws, target)
    if tls:
        tls_chart(tls, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
