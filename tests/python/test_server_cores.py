"""`--cores N`: every pair serves, in sub-interpreters (3.13+) or worker processes, supervised and drained.

The isolation under test follows the Python running the tests: on 3.13+ both
modes are exercised, on 3.11 worker processes only (3.11 has no own-GIL
sub-interpreters). Every test runs a real server process with real clients.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_harness import APPS, ServerProcess, SlowLoad, read_response

SUBINTERPRETERS = sys.version_info >= (3, 13)
#: The modes this Python can run; the first is what `--isolation auto` gives a plain app.
MODES = ["subinterpreters", "processes"] if SUBINTERPRETERS else ["processes"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_cli(*args: str, app_dir: Path = APPS, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cadeloop", *args, "--app-dir", str(app_dir)],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def pair_of(url: str) -> dict[str, object]:
    """GET /pair on a fresh connection (SO_REUSEPORT spreads connections, not requests)."""
    with httpx.Client(timeout=10) as client:
        r = client.get(url + "/pair", headers={"connection": "close"})
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


def pairs_seen(url: str, tries: int = 200) -> dict[int, set[int]]:
    """pair index -> pids, from fresh connections until both of two pairs answered."""
    seen: dict[int, set[int]] = {}
    for _ in range(tries):
        p = pair_of(url)
        seen.setdefault(int(p["pair"]), set()).add(int(p["pid"]))  # type: ignore[call-overload]
        if len(seen) == 2:
            break
    return seen


def events(path: Path) -> list[str]:
    return sorted(" ".join(line.split()[:2]) for line in path.read_text().splitlines()) if path.exists() else []


# --------------------------------------------------------------------------- CPUs


def expected_usable_cpus() -> int:
    """What --cores 0 should pick, computed here independently of cadeloop."""
    n = len(os.sched_getaffinity(0))
    rel = ""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip("/")
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts) + 1):
        f = Path("/sys/fs/cgroup", *parts[:depth], "cpu.max")
        if f.exists():
            quota, period = f.read_text().split()
            if quota != "max":
                n = min(n, int(quota) // int(period))
    return max(1, n)


def test_cgroup_quota_is_read_along_the_cgroup_path(tmp_path: Path) -> None:
    from cadeloop._cpus import cgroup_cpu_quota

    proc = tmp_path / "cgroup"
    proc.write_text("0::/outer/inner\n")
    (tmp_path / "fs" / "outer" / "inner").mkdir(parents=True)
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(proc)) is None
    (tmp_path / "fs" / "outer" / "inner" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "fs" / "outer" / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(proc)) == 2.5
    (tmp_path / "fs" / "outer" / "inner" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(proc)) == 1.5


def test_cores_0_is_one_pair_per_usable_cpu(tmp_path: Path) -> None:
    n = expected_usable_cpus()
    srv = ServerProcess("cores_app:app", "--cores", "0", tmp=tmp_path).start()
    try:
        if n == 1:
            assert "(1 core pair, pid" in srv.log()
        else:
            assert f"({n} core pairs, isolation {MODES[0]}, pid {srv.pid})" in srv.log()
    finally:
        assert srv.stop() == 0, srv.log()


# --------------------------------------------------------------------------- serving on every pair


@pytest.mark.parametrize("isolation", MODES)
def test_two_pairs_both_serve_and_each_runs_lifespan_once(tmp_path: Path, isolation: str) -> None:
    ev = tmp_path / "events.txt"
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, tmp=tmp_path,
                        env={"CORES_APP_EVENTS": str(ev)}).start()
    try:
        log = srv.log()
        assert f"listening on http://127.0.0.1:{srv.port} (2 core pairs, isolation {isolation}, pid {srv.pid})" in log
        assert log.count("listening on http://") == 1
        seen = pairs_seen(srv.url)
        assert sorted(seen) == [0, 1], seen
        p = pair_of(srv.url)
        if isolation == "subinterpreters":
            # Issue 17: the pairs' interpreters live in serving processes under the one started
            # (crash containment), not in it.
            assert srv.pid not in seen[0] | seen[1]
            assert p["main_interpreter"] is False
        else:
            assert seen[0].isdisjoint(seen[1]) and srv.pid not in seen[0] | seen[1]
            assert p["main_interpreter"] is True
    finally:
        assert srv.stop() == 0, srv.log()
    assert events(ev) == ["shutdown pair=0", "shutdown pair=1", "startup pair=0", "startup pair=1"], ev.read_text()


def test_auto_gives_a_plain_app_the_best_isolation(tmp_path: Path) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", tmp=tmp_path).start()
    try:
        if SUBINTERPRETERS:
            assert "isolation subinterpreters (auto: the app imports in an own-GIL sub-interpreter)" in srv.log()
            assert pair_of(srv.url)["main_interpreter"] is False
        else:
            assert "isolation processes (CPython 3.11 has no own-GIL sub-interpreters)" in srv.log()
    finally:
        assert srv.stop() == 0, srv.log()


REFUSER_C = r"""
#include <Python.h>
static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "refuser", NULL, 0, NULL, slots};
PyMODINIT_FUNC PyInit_refuser(void) { return PyModuleDef_Init(&def); }
"""


def build_refuser(where: Path) -> None:
    """A C extension that declares it cannot be loaded in sub-interpreters, compiled here."""
    (where / "refuser.c").write_text(REFUSER_C)
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    out = where / f"refuser{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run([*cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(where / "refuser.c"),
                    "-o", str(out)], check=True, capture_output=True)


def test_auto_falls_back_to_processes_naming_the_module_that_refused(tmp_path: Path) -> None:
    build_refuser(tmp_path)
    (tmp_path / "refusing_app.py").write_text(
        f"import sys\nsys.path.insert(0, {str(APPS)!r})\nimport refuser\nfrom cores_app import app\n")
    srv = ServerProcess("refusing_app:app", "--cores", "2", tmp=tmp_path, app_dir=tmp_path).start()
    try:
        log = srv.log()
        if SUBINTERPRETERS:
            lines = [line for line in log.splitlines() if "refuser" in line]
            assert lines == ["cadeloop: isolation processes (auto: module refuser does not support loading in "
                             "subinterpreters)"], log
        assert "isolation processes" in log
        assert sorted(pairs_seen(srv.url)) == [0, 1]
    finally:
        assert srv.stop() == 0, srv.log()


def test_fastapi_example_is_served_on_two_pairs_with_auto(tmp_path: Path) -> None:
    srv = ServerProcess("fastapi_app:app", "--cores", "2", tmp=tmp_path, app_dir=EXAMPLES).start()
    try:
        log = srv.log()
        if SUBINTERPRETERS:
            # pydantic-core is a single-phase-init extension: it refuses sub-interpreters.
            m = re.search(r"isolation (\w+) \((.*)\)", log)
            assert m, log
            if m.group(1) == "processes":
                assert re.fullmatch(r"auto: module (\S+) does not support loading in subinterpreters", m.group(2))
        for _ in range(20):
            with httpx.Client(timeout=10) as c:
                assert c.get(srv.url + "/").json() == {"message": "Hello, World!"}
                r = c.post(srv.url + "/items", json={"name": "x", "price": 2.5})
                assert r.json()["total"] == 5.0
    finally:
        assert srv.stop() == 0, srv.log()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin two pairs apart")
@pytest.mark.parametrize("isolation", MODES)
def test_pin_ties_each_pair_to_its_own_cpus(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--pin", tmp=tmp_path).start()
    try:
        cpus: dict[int, list[int]] = {}
        for _ in range(200):
            p = pair_of(srv.url)
            cpus[int(p["pair"])] = p["cpus"]  # type: ignore[call-overload,assignment]
            if len(cpus) == 2:
                break
        assert sorted(cpus) == [0, 1]
        assert cpus[0] and cpus[1] and not set(cpus[0]) & set(cpus[1]), cpus
    finally:
        assert srv.stop() == 0, srv.log()
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, tmp=tmp_path).start()
    try:
        assert pair_of(srv.url)["cpus"] == sorted(os.sched_getaffinity(0))
    finally:
        assert srv.stop() == 0, srv.log()


if SUBINTERPRETERS:  # sub-interpreters need CPython 3.13+; on 3.11 these tests do not exist
    def test_threads_the_app_started_are_waited_for_before_its_interpreter_ends(tmp_path: Path) -> None:
        srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", "subinterpreters", tmp=tmp_path).start()
        started = httpx.get(srv.url + "/threads?secs=1.5").json()
        assert started[0] == "thread"
        time.sleep(0.2)
        t0 = time.monotonic()
        assert srv.stop() == 0, srv.log()  # no abort in Py_EndInterpreter: it ran after the threads ended
        assert time.monotonic() - t0 > 1.0

        srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", "subinterpreters", tmp=tmp_path).start()
        httpx.get(srv.url + "/threads?secs=3600")
        rc = srv.stop()
        assert rc == 1, srv.log()  # not -6 (SIGABRT): the interpreter was left, the process exited
        assert "thread(s) the app started still run; the interpreter was not ended" in srv.log()
        assert "exiting without finalizing" in srv.log()


# --------------------------------------------------------------------------- start-up failures


@pytest.mark.parametrize("isolation", MODES)
def test_failed_lifespan_startup_on_two_pairs_exits_with_the_apps_message(isolation: str) -> None:
    p = run_cli("failing_startup_app:app", "--port", "0", "--cores", "2", "--isolation", isolation)
    assert p.returncode == 3, p.stderr
    assert p.stderr.rstrip().endswith("cadeloop: lifespan startup failed: database unreachable"), p.stderr
    assert "listening on" not in p.stderr


if SUBINTERPRETERS:  # sub-interpreters need CPython 3.13+; on 3.11 these tests do not exist
    def test_app_that_raises_at_import_in_a_subinterpreter_stops_the_server_with_its_message() -> None:
        p = run_cli("cores_app:app", "--port", "0", "--cores", "2", "--isolation", "subinterpreters",
                    env={"CORES_APP_FAIL_IN_SUBINTERPRETER": "1"})
        assert p.returncode == 1, p.stderr
        assert ("cadeloop: importing 'cores_app:app' raised RuntimeError: cores_app refuses to load in a "
                "sub-interpreter") in p.stderr
        assert "Traceback (most recent call last)" in p.stderr
        assert "listening on" not in p.stderr


def test_pairs_that_keep_dying_at_start_are_given_up() -> None:
    p = run_cli("dying_app:app", "--port", "0", "--cores", "2", "--isolation", "processes")
    assert p.returncode == 1, p.stderr
    assert "giving up on it" in p.stderr
    assert p.stderr.rstrip().splitlines()[-1].startswith("cadeloop: every core pair kept dying at start (last: pair ")
    assert p.stderr.count("restarting it") == 8  # 4 restarts per pair, the 5th death gives up


def test_more_than_one_pair_needs_tcp(tmp_path: Path) -> None:
    p = run_cli("cores_app:app", "--uds", str(tmp_path / "s.sock"), "--cores", "2")
    assert p.returncode == 2
    assert p.stderr.startswith("cadeloop: --cores 2: more than one core pair needs a TCP address"), p.stderr


# --------------------------------------------------------------------------- supervision


def test_worker_killed_under_load_is_replaced_and_only_its_connections_fail(tmp_path: Path) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", "processes", tmp=tmp_path).start()
    stop = threading.Event()
    lock = threading.Lock()
    ok_by_pid: dict[int, int] = {}
    failed_last_pid: list[int | None] = []  # per failed connection: the pid of its last answer

    def client() -> None:
        while not stop.is_set():
            last: int | None = None
            try:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                    f = s.makefile("rb")
                    for _ in range(30):
                        s.sendall(b"GET /slow?delay=0.005 HTTP/1.1\r\nHost: x\r\n\r\n")
                        status, _, body = read_response(f)
                        assert status == 200
                        last = int(body.split()[-1])
                        with lock:
                            ok_by_pid[last] = ok_by_pid.get(last, 0) + 1
                        if stop.is_set():
                            break
            except (OSError, EOFError, ValueError, IndexError):
                with lock:
                    failed_last_pid.append(last)

    threads = [threading.Thread(target=client) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        with lock:
            victims = sorted(ok_by_pid)
        assert len(victims) == 2, ok_by_pid
        victim, survivor = victims
        os.kill(victim, signal.SIGKILL)
        srv.wait_log(rf"pair \d \(pid {victim}\) killed by SIGKILL; restarting it")
        srv.wait_log(r"serving on .*\n(.|\n)*serving on .*\n(.|\n)*serving on ")  # the replacement is up
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        with lock:
            replacements = set(ok_by_pid) - {victim, survivor}
            assert replacements, ok_by_pid  # the new worker answered
            assert all(pid in (victim, None) for pid in failed_last_pid), (failed_last_pid, victim)
            assert ok_by_pid[survivor] > 50
        assert sorted(pairs_seen(srv.url)) == [0, 1]
    finally:
        stop.set()
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_workers_drain_and_exit_when_the_supervisor_dies(tmp_path: Path) -> None:
    ev = tmp_path / "events.txt"
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", "processes", tmp=tmp_path,
                        env={"CORES_APP_EVENTS": str(ev)}).start()
    pids = {int(pid) for pid in re.findall(r"serving on \S+ \(pid (\d+)\)", srv.log())}
    assert len(pids) == 2
    srv.stop(signal.SIGKILL)
    deadline = time.monotonic() + 20
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pids.discard(pid)
        time.sleep(0.05)
    assert not pids, "workers outlived their supervisor"
    assert events(ev).count("shutdown pair=0") == events(ev).count("shutdown pair=1") == 1, ev.read_text()


# --------------------------------------------------------------------------- graceful drain


@pytest.mark.parametrize("isolation", MODES)
def test_sigterm_under_load_on_two_pairs_loses_no_accepted_request(tmp_path: Path, isolation: str) -> None:
    stats_file = tmp_path / "stats.json"
    ev = tmp_path / "events.txt"
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--grace", "10",
                        "--stats-json-on-exit", str(stats_file), tmp=tmp_path,
                        env={"CORES_APP_EVENTS": str(ev)}).start()
    load = SlowLoad(srv.port).start()
    time.sleep(1.5)
    started = time.monotonic()
    rc = srv.stop(signal.SIGTERM)
    took = time.monotonic() - started
    load.stop()
    log = srv.log()
    assert rc == 0, log
    assert took < 10, took
    assert load.truncated == 0
    complete = len(load.bodies)
    by_pair: dict[str, int] = {}
    for body in load.bodies:  # "slow done PAIR ..."
        pair = body.split()[2].decode()
        by_pair[pair] = by_pair.get(pair, 0) + 1
    assert sorted(by_pair) == ["0", "1"] and min(by_pair.values()) > 10, by_pair
    stats = json.loads(stats_file.read_text())
    assert stats["isolation"] == isolation and stats["cores"] == 2
    # Every request a pair took got its whole response, and the clients read them all.
    assert stats["requests"] == stats["responses"] == complete, (stats, complete)
    assert [p["requests"] for p in stats["pairs"]] == [by_pair["0"], by_pair["1"]]
    assert events(ev) == ["shutdown pair=0", "shutdown pair=1", "startup pair=0", "startup pair=1"], ev.read_text()


def slow_request(port: int, delay: float, result: list[object]) -> threading.Thread:
    def go() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(f"GET /slow?delay={delay} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                result.append(read_response(s.makefile("rb"))[0])
        except (OSError, EOFError, ValueError, IndexError) as exc:
            result.append(type(exc).__name__)

    t = threading.Thread(target=go)
    t.start()
    return t


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("isolation", MODES)
def test_a_second_sigterm_or_sigint_cuts_the_drain_short(tmp_path: Path, isolation: str, sig: int) -> None:
    # Issue 17 changed the second SIGTERM: it used to keep draining; now, as a second SIGINT, it cuts short.
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--grace", "30",
                        tmp=tmp_path).start()
    result: list[object] = []
    t = slow_request(srv.port, 20.0, result)
    time.sleep(0.5)
    assert srv.proc is not None
    started = time.monotonic()
    srv.proc.send_signal(sig)
    time.sleep(0.3)
    rc = srv.stop(sig)
    t.join(10)
    assert time.monotonic() - started < 8, srv.log()
    assert rc == 0, srv.log()
    assert result and result != [200], result
    assert f"{signal.Signals(sig).name} again: cutting the drain short" in srv.log()
