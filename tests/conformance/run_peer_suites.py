#!/usr/bin/env python3
"""Run other libraries' own test suites on asyncio and on cadeloop, and compare.

For each suite of peer_suites.py: the pinned source distribution is fetched
from PyPI with pip (hash-checked) into build/peer/dist/ and unpacked into
build/peer/src/; its tests then run twice, at the same time, in two pytest
child processes of the interpreter running this script: once on asyncio's own
loop and once with cadeloop as the loop (peer_plugin.py), each test under a
per-test timeout (pytest-timeout). The installed library (tests/requirements.txt)
must be the pinned version.

A test that passes on asyncio and not on cadeloop is run once more on
cadeloop alone; if it fails again it is a difference, and the run fails unless
KNOWN_DIFFERENCES names it. A test that hit the timeout in either run fails the
run too.

Usage:
    python tests/conformance/run_peer_suites.py [--json FILE] [--timeout S] [suite ...]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / "build" / "peer"
sys.path.insert(0, str(HERE))

from peer_suites import KNOWN_DIFFERENCES, SUITES  # noqa: E402

MODES = ("asyncio", "cadeloop")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, suite: dict[str, Any]) -> Path:
    """The unpacked source tree of the suite's pinned sdist, fetched once into build/peer/."""
    version = suite["version"]
    src = CACHE / "src" / f"{name}-{version}"
    if (src / ".complete").exists():
        return src
    dist = CACHE / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    archive = dist / f"{name}-{version}.tar.gz"
    if not archive.exists() or sha256_of(archive) != suite["sha256"]:
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(f"{name}=={version} --hash=sha256:{suite['sha256']}\n")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                 "--no-binary", ":all:", "--no-deps", "--require-hashes", "-r", str(req), "-d", tmp],
                check=True,
            )
            got = next(Path(tmp).glob(f"{name}-{version}.tar.gz"))
            if sha256_of(got) != suite["sha256"]:
                raise SystemExit(f"{got.name}: sha256 differs from the pin in peer_suites.py")
            os.replace(got, archive)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else tar.extractall(tmp)
        unpacked = Path(tmp) / f"{name}-{version}"
        (unpacked / ".complete").write_text(suite["sha256"] + "\n")
        src.parent.mkdir(parents=True, exist_ok=True)
        if not (src / ".complete").exists():
            os.replace(unpacked, src)
    return src


def pytest_command(src: Path, suite: dict[str, Any], timeout: float, ini: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(src),
        "-p", "no:cacheprovider", "-p", "peer_plugin", "--timeout", str(timeout), "-q", "-rfE",
        *(extra or suite["pytest_args"]),
    ]


def start(name: str, src: Path, suite: dict[str, Any], mode: str, timeout: float, work: Path,
          only: list[str] | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    tag = f"{name}-{mode}-py{sys.version_info[0]}{sys.version_info[1]}" + ("-rerun" if only else "")
    ini = work / f"{name}.ini"
    ini.write_text(suite["ini"])
    results = work / f"{tag}.json"
    log = work / f"{tag}.log"
    results.unlink(missing_ok=True)
    env = dict(os.environ, CADELOOP_PEER_MODE=mode, CADELOOP_PEER_RESULTS=str(results),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    # Suites that write files (hypothesis' example database) write them under build/peer/.
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(work / "hypothesis")
    with log.open("wb") as out:
        proc = subprocess.Popen(pytest_command(src, suite, timeout, ini, only or []), cwd=src, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, results, log


def finish(proc: subprocess.Popen[bytes], results: Path, log: Path, limit: float) -> dict[str, Any]:
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"{log.name}: the suite ran longer than {limit:.0f}s; see {log}")
    if not results.exists():
        raise SystemExit(f"{log.name}: pytest wrote no results (exit {proc.returncode}); see {log}")
    return json.loads(results.read_text())["tests"]


def counts(tests: dict[str, Any]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for entry in tests.values():
        out[entry["outcome"]] += 1
    return out


def run_suite(name: str, timeout: float, limit: float) -> dict[str, Any]:
    suite = SUITES[name]
    installed = importlib.metadata.version(name)
    if installed != suite["version"]:
        raise SystemExit(f"{name} {installed} is installed, the suite is pinned at {suite['version']}: "
                         "install tests/requirements.txt")
    src = fetch(name, suite)
    work = CACHE / "runs"
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    running = {mode: start(name, src, suite, mode, timeout, work) for mode in MODES}
    try:
        runs = {mode: finish(*running[mode], limit) for mode in MODES}
    finally:
        for proc, _, _ in running.values():
            if proc.poll() is None:  # the other run, when one ran out of time
                proc.kill()
                proc.wait()
    on_asyncio, on_cadeloop = runs["asyncio"], runs["cadeloop"]
    passing = sorted(t for t, e in on_asyncio.items() if e["outcome"] == "passed")
    lost = [t for t in passing if on_cadeloop.get(t, {}).get("outcome") != "passed"]
    flaky: list[str] = []
    if lost:
        proc, results, log = start(name, src, suite, "cadeloop", timeout, work, only=lost)
        again = finish(proc, results, log, limit)
        flaky = [t for t in lost if again.get(t, {}).get("outcome") == "passed"]
    differences = [t for t in lost if t not in flaky]
    known = KNOWN_DIFFERENCES.get(name, {})
    # Tests that ran on cadeloop made only cadeloop loops; a test that made another loop
    # (a suite's explicit SelectorEventLoop(), say) did not test cadeloop there.
    foreign = sorted(t for t, e in on_cadeloop.items()
                     if any(not loop.startswith("cadeloop.") for loop in e.get("loops", [])))
    return {
        "suite": name,
        "version": suite["version"],
        "seconds": round(time.monotonic() - began, 1),
        "asyncio": counts(on_asyncio),
        "cadeloop": counts(on_cadeloop),
        "on_cadeloop": sum(1 for e in on_cadeloop.values() if any(x.startswith("cadeloop.") for x in e.get("loops", []))),
        "differences": {t: known.get(t, "") for t in differences},
        "unexplained": [t for t in differences if t not in known],
        "flaky": flaky,
        "cadeloop_only": sorted(t for t, e in on_cadeloop.items()
                                if e["outcome"] == "passed" and on_asyncio.get(t, {}).get("outcome") == "failed"),
        "timeouts": {mode: sorted(t for t, e in runs[mode].items() if e["timeout"]) for mode in MODES},
        "made_other_loops": foreign,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", default=list(SUITES), help="suites to run (default: all)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--timeout", type=float, default=20.0, help="per-test timeout in seconds")
    parser.add_argument("--limit", type=float, default=900.0, help="whole-run limit per suite and loop, seconds")
    args = parser.parse_args()
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; known: {sorted(SUITES)}")
    reports = [run_suite(name, args.timeout, args.limit) for name in args.suites]
    py = ".".join(map(str, sys.version_info[:3]))
    print(f"peer suites on Python {py}: asyncio vs cadeloop, passed/failed/skipped")
    for r in reports:
        a, c = r["asyncio"], r["cadeloop"]
        print(f"  {r['suite']} {r['version']}: asyncio {a['passed']}/{a['failed']}/{a['skipped']}, "
              f"cadeloop {c['passed']}/{c['failed']}/{c['skipped']} ({r['on_cadeloop']} on a cadeloop loop), "
              f"{r['seconds']}s")
        for t, why in r["differences"].items():
            print(f"    passes on asyncio, fails on cadeloop: {t}" + (f" (known: {why})" if why else ""))
        for t in r["flaky"]:
            print(f"    failed once on cadeloop, passed on the rerun: {t}")
        for t in r["cadeloop_only"]:
            print(f"    fails on asyncio, passes on cadeloop: {t}")
        for mode, hit in r["timeouts"].items():
            for t in hit:
                print(f"    hit the per-test timeout on {mode}: {t}")
        for t in r["made_other_loops"]:
            print(f"    made a loop other than cadeloop's in the cadeloop run: {t}")
    if args.json:
        args.json.write_text(json.dumps({"python": py, "suites": reports}, indent=2))
    bad = any(r["unexplained"] or any(r["timeouts"].values()) for r in reports)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
