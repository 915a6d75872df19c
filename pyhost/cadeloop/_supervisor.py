"""Every core: N core pairs, each app thread in its own interpreter, supervised.

Two ways to give each pair its own interpreter (and so its own GIL):

- ``subinterpreters`` (CPython 3.13+): one process. The main thread starts a
  native thread per pair (cadeloop._core.interp_start); that thread creates an
  own-GIL sub-interpreter, imports cadeloop there and calls
  `run_interp_pair`, which builds and runs a single-pair `Server` (lifespan
  included), and then ends its interpreter. The main thread owns
  SIGINT/SIGTERM/SIGHUP and stops the pairs through the C++ registry (an
  eventfd each pair's loop watches); it waits for the pairs in short slices
  with its GIL released and never finalizes before every interpreter ended.
- ``processes`` (3.11, 3.12, or an app whose extension modules refuse
  sub-interpreters): the main process is a supervisor. It forks one worker per
  pair before any thread exists; each worker runs the single-pair `Server` on
  its main thread with its own SO_REUSEPORT listener on the same port. The
  supervisor restarts a worker that dies, gives up on one that keeps dying at
  start, and forwards stop requests over a pipe (whose end of file also stops
  a worker whose supervisor is gone; PR_SET_PDEATHSIG backs that up).

``auto`` imports the app in a probe sub-interpreter first (3.13+) and falls
back to processes when a module refuses ("module X does not support loading
in subinterpreters").

Nothing Python crosses an interpreter: a pair gets its settings as a JSON
string and reports back plain strings and ints.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import re
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

from . import _core

logger = logging.getLogger("cadeloop")

#: A pair that dies sooner than this (seconds) after it was started died "at start".
START_WINDOW = 10.0
#: A pair that died at start this many times within GIVE_UP_WINDOW seconds is given up on.
GIVE_UP_AFTER = 5
GIVE_UP_WINDOW = 60.0
#: Seconds threads an app started get to end after its pair stopped, before its interpreter ends.
THREAD_GRACE = 5.0

_REFUSED = re.compile(r"module (\S+) does not support loading in subinterpreters")
_PROBE_REFUSED = 10  # exit code of probe_app: a module refused the sub-interpreter

PY312_REFUSAL = (
    "own-GIL sub-interpreters are not used on CPython 3.12 (3.12.1 aborts the process when a second "
    "sub-interpreter imports datetime, sqlite3, http.client or tomllib, or runs asyncio before the main "
    "interpreter did); use CPython 3.13+ for them"
)


# --------------------------------------------------------------------------- CPUs


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs the cgroup v2 `cpu.max` quota allows this process (the smallest along its cgroup path), or None."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    parts = [p for p in path.strip("/").split("/") if p]
    quota: float | None = None
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(root, *parts[:depth], "cpu.max")) as f:
                fields = f.read().split()
        except OSError:
            continue
        if len(fields) == 2 and fields[0] != "max":
            try:
                q = int(fields[0]) / int(fields[1])
            except (ValueError, ZeroDivisionError):
                continue
            quota = q if quota is None else min(quota, q)
    return quota


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask and its cgroup quota (rounded down), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, int(quota))
    return max(1, n)


def resolve_cores(cores: int) -> int:
    """The number of pairs `--cores` asks for (0: one per usable CPU)."""
    return cores if cores > 0 else usable_cpus()


def pin_sets(n: int) -> list[list[int]]:
    """For each of n pairs, the CPUs it is tied to: one physical core (its hyperthread siblings) each, in turn."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cores: list[list[int]] = []
    seen: set[int] = set()
    for cpu in allowed:
        if cpu in seen:
            continue
        siblings = {cpu}
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                for part in f.read().strip().split(","):
                    lo, _, hi = part.partition("-")
                    siblings.update(range(int(lo), int(hi or lo) + 1))
        except (OSError, ValueError):
            pass
        group = sorted(siblings & set(allowed))
        seen.update(group)
        cores.append(group)
    return [cores[i % len(cores)] for i in range(n)]


# --------------------------------------------------------------------------- helpers


def _pair_logging(index: int, log_level: str) -> None:
    """Prefixes this interpreter's (or worker's) log lines with its pair and applies --log-level.

    Before the app is imported, so the pair's first line is filtered and
    prefixed already. A worker process inherits the supervisor's handler; a
    sub-interpreter starts with none and gets its own.
    """
    from .server import _apply_log_level, _configure_logging, _ServerLogHandler

    _configure_logging()
    for handler in logger.handlers:
        if isinstance(handler, _ServerLogHandler):
            handler.set_prefix(f"pair {index}: ")
    _apply_log_level(log_level)


def _forget_dummy_thread() -> None:
    """Drops threading's record of this native thread while threading still works (3.13+).

    The thread an interpreter pair runs on was not started by `threading`,
    so `current_thread()` (logging calls it) makes a _DummyThread whose
    clean-up would otherwise run during Py_EndInterpreter, after the
    module's globals are gone ("Exception ignored in ... _DeleteDummyThreadOnDel").
    """
    import threading

    info = getattr(threading, "_thread_local_info", None)
    if info is not None and hasattr(info, "_track_dummy_thread_ref"):
        del info._track_dummy_thread_ref


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


_NOT_ADDITIVE = frozenset({"pid", "index", "state", "started_unix_ms"})


def merge_stats(per_pair: dict[int, list[dict[str, Any]]], isolation: str) -> dict[str, Any]:
    """One JSON-able dict: totals at the top (as with one pair), and `pairs`: each pair's counters.

    A pair that was restarted contributes the sum over its workers.
    """
    pairs = []
    totals: dict[str, Any] = {}
    for index in sorted(per_pair):
        pair: dict[str, Any] = {"pair": index, "starts": len(per_pair[index])}
        for stats in per_pair[index]:
            for key, value in stats.items():
                if key in _NOT_ADDITIVE or key.startswith("latency_p"):
                    continue  # percentiles and identities do not add up; see stats["region"]
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    pair[key] = pair.get(key, 0) + value
        pairs.append(pair)
        for key, value in pair.items():
            if key not in ("pair", "starts"):
                totals[key] = totals.get(key, 0) + value
    totals["cores"] = len(pairs)
    totals["isolation"] = isolation
    totals["pairs"] = pairs
    return totals


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _pair_settings(config: Any, port: int) -> dict[str, Any]:
    """The settings of one pair (as JSON-able data): the server's, for one pair on the chosen port."""
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    settings.update(cores=1, port=port, stats_json_on_exit=None)
    return settings


def _config_class_name(config: Any) -> str:
    return f"{type(config).__module__}:{type(config).__qualname__}"


def _make_config(class_name: str, settings: dict[str, Any]) -> Any:
    """The settings class named "module:Class" (imported in this interpreter), made from `settings`."""
    import importlib

    module, _, name = class_name.partition(":")
    return getattr(importlib.import_module(module), name)(**settings)


# --------------------------------------------------------------------------- choosing the isolation


def probe_app(argument: str, slot: int) -> tuple[int, str, str]:
    """Runs in a probe sub-interpreter: imports the app. (0, '', '') if it loads there."""
    from .server import load_app

    data = json.loads(argument)
    try:
        load_app(data["app"], data["app_dir"], data["factory"])
    except ImportError as exc:
        m = _REFUSED.search(str(exc))
        if m:
            return _PROBE_REFUSED, m.group(1), ""
        return 1, f"{type(exc).__name__}: {exc}", ""
    except Exception as exc:
        return 1, f"{type(exc).__name__}: {exc}", ""
    finally:
        _forget_dummy_thread()
    return 0, "", ""


def _wait_interp(slot: int) -> tuple[Any, ...]:
    while not _core.interp_wait(slot, 0.05):
        pass  # slices: signal handlers run between them
    status = _core.interp_status(slot)
    _core.interp_release(slot)
    return tuple(status)


def choose_isolation(config: Any) -> tuple[str, str]:
    """(isolation, why) for config: 'subinterpreters' or 'processes', and the reason for the log line."""
    asked = config.isolation
    if asked == "processes":
        return "processes", "asked for"
    if not _core.own_gil_supported():
        why = f"CPython {sys.version_info[0]}.{sys.version_info[1]} has no own-GIL sub-interpreters"
        return "processes", why if asked == "auto" else f"--isolation subinterpreters: {why}"
    if sys.version_info < (3, 13):
        return "processes", PY312_REFUSAL
    if not isinstance(config.app, str):
        return "processes", "the app was given as an object; a sub-interpreter must import it by 'module:attribute'"
    if asked == "subinterpreters":
        return "subinterpreters", "asked for"
    argument = json.dumps({"app": config.app, "app_dir": config.app_dir, "factory": config.factory})
    slot = _core.interp_start("cadeloop._supervisor", "probe_app", argument, [], 1.0)
    _, _, _, _, code, message, _ = _wait_interp(slot)
    if code == 0:
        return "subinterpreters", "auto: the app imports in an own-GIL sub-interpreter"
    if code == _PROBE_REFUSED:
        return "processes", f"auto: module {message} does not support loading in subinterpreters"
    return "processes", f"auto: importing the app in a sub-interpreter failed ({message})"


# --------------------------------------------------------------------------- pairs


class _Pair:
    """One core pair as the supervisor sees it (a worker process or an interpreter thread)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.started_at = 0.0
        self.running = False
        self.ready = False
        self.description = ""
        self.deaths: list[float] = []  # times of deaths at start
        self.given_up = False
        self.restart_at: float | None = None
        self.stats: list[dict[str, Any]] = []
        self.error: tuple[int, str] | None = None  # a start-up failure the pair reported
        self.starts = 0

    def mark_started(self) -> None:
        """A worker or interpreter for this pair was just started."""
        self.running = True
        self.ready = False
        self.error = None
        self.started_at = time.monotonic()
        self.starts += 1


class _Supervisor:
    """Runs N pairs on the main thread until a stop; subclasses say where each pair's interpreter lives."""

    isolation = ""

    def __init__(self, config: Any, app: Any, n: int, port: int, reserved: socket.socket | None) -> None:
        self.config = config
        self.app = app
        self.pairs = [_Pair(i) for i in range(n)]
        self.port = port
        self.reserved = reserved
        self.pins = pin_sets(n) if config.pin else [[] for _ in range(n)]
        self.stop_level = 0
        self.stop_deadline = 0.0
        self.up = False
        self.failure: tuple[int, str] | None = None
        self.settings = _pair_settings(config, port)
        self.pid = os.getpid()
        # One page of counters per pair, shared with the workers (made before any fork) and
        # reached by address from sub-interpreters; the stats endpoint reads it.
        self.region = _core.StatsRegion(n)
        self.endpoint: Any = None

    # --- to implement
    def start_pair(self, pair: _Pair) -> None:
        raise NotImplementedError

    def stop_pair(self, pair: _Pair, level: int) -> None:
        raise NotImplementedError

    def wait(self, timeout: float) -> None:
        """Sleeps up to timeout, returning early when a pair reports; updates the pairs."""
        raise NotImplementedError

    def kill_all(self) -> None:
        raise NotImplementedError

    # --- the policy, shared by both modes
    def on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop_level == 0:
            logger.info("%s: shutting down %d core pairs: finishing requests in flight (grace %gs)",
                        name, len(self.pairs), self.config.grace)
            self.request_stop(1)
        elif signum == signal.SIGINT and self.stop_level < 2:
            logger.info("SIGINT again: cutting the drain short")
            self.request_stop(2)
        else:
            logger.info("%s again: still finishing requests in flight", name)

    def request_stop(self, level: int) -> None:
        if self.stop_level == 0:
            self.stop_deadline = time.monotonic() + self.config.grace + THREAD_GRACE + 10.0
            if self.endpoint is not None:
                self.endpoint.set_draining()  # /readyz says 503 before the listeners close
        self.stop_level = max(self.stop_level, level)
        for pair in self.pairs:
            pair.restart_at = None
            if pair.running:
                self.stop_pair(pair, level)

    def pair_ended(self, pair: _Pair, how: str, clean: bool) -> None:
        """A pair's worker exited or its interpreter thread finished."""
        pair.running = False
        was_ready, pair.ready = pair.ready, False
        detail = f": {pair.error[1]}" if pair.error else ""
        if self.stop_level:
            if not clean:
                logger.error("pair %d %s while shutting down%s", pair.index, how, detail)
                self.failure = self.failure or (1, f"pair {pair.index} {how} while shutting down{detail}")
            return
        if pair.error is not None and not self.up:
            # The app failed to start (import, lifespan, address): stop the server with its message.
            self.failure = pair.error
            logger.info("pair %d failed to start; stopping the other pairs", pair.index)
            self.request_stop(1)
            return
        now = time.monotonic()
        if not was_ready or now - pair.started_at < START_WINDOW:
            pair.deaths = [t for t in pair.deaths if now - t < GIVE_UP_WINDOW] + [now]
        if len(pair.deaths) >= GIVE_UP_AFTER:
            pair.given_up = True
            logger.error("pair %d %s%s; it died %d times within %gs of starting: giving up on it",
                         pair.index, how, detail, len(pair.deaths), GIVE_UP_WINDOW)
            if all(p.given_up for p in self.pairs):
                self.failure = (1, f"every core pair kept dying at start (last: pair {pair.index} {how}{detail})")
                self.request_stop(1)
            return
        delay = 0.0 if len(pair.deaths) <= 1 else min(0.1 * 2 ** (len(pair.deaths) - 2), 2.0)
        logger.error("pair %d %s%s; restarting it", pair.index, how, detail)
        pair.restart_at = now + delay

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            from ._stats import start_endpoint

            self.endpoint = start_endpoint(self.config, self.region, self.isolation)
            for pair in self.pairs:
                self.start_pair(pair)
            while any(p.running or p.restart_at is not None for p in self.pairs):
                now = time.monotonic()
                for pair in self.pairs:
                    if pair.restart_at is not None and now >= pair.restart_at and not self.stop_level:
                        pair.restart_at = None
                        self.start_pair(pair)
                if not self.up and not self.stop_level and all(p.ready or p.given_up for p in self.pairs):
                    self.up = True
                    self.announce()
                if self.stop_level and now > self.stop_deadline:
                    self.failure = self.failure or (1, "core pairs did not stop within grace; killed")
                    logger.error("core pairs did not stop within grace + %gs; killing them", THREAD_GRACE + 10)
                    self.kill_all()
                    break
                pending = [p.restart_at for p in self.pairs if p.restart_at is not None]
                self.wait(max(0.0, min([0.05, *(t - now for t in pending)])))
        finally:
            if any(p.running for p in self.pairs):
                self.request_stop(1)
                self.kill_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.reserved is not None:
                self.reserved.close()
            if self.endpoint is not None:
                self.endpoint.close()
                self.endpoint = None

    def announce(self) -> None:
        live = [p for p in self.pairs if not p.given_up]
        described = dataclasses.replace(self.config, port=self.port).describe_listen()
        logger.info("listening on http://%s (%d core pairs, isolation %s, pid %d)",
                    described, len(live), self.isolation, os.getpid())


class _ProcessSupervisor(_Supervisor):
    """One forked worker process per pair."""

    isolation = "processes"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.workers: dict[int, _Pair] = {}  # pid -> pair
        self.fds: dict[int, tuple[int, int]] = {}  # pair index -> (status_r, control_w)
        self.buffers: dict[int, bytes] = {}
        self.pids: dict[int, int] = {}  # pair index -> pid

    def start_pair(self, pair: _Pair) -> None:
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(status_r)
                os.close(control_w)
                for r, w in self.fds.values():
                    os.close(r)
                    os.close(w)
                if self.reserved is not None:
                    self.reserved.close()
                code = self.worker_main(pair.index, status_w, control_r)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    logging.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(status_w)
        os.close(control_r)
        os.set_blocking(status_r, False)
        self.fds[pair.index] = (status_r, control_w)
        self.buffers[pair.index] = b""
        self.workers[pid] = pair
        self.pids[pair.index] = pid
        pair.mark_started()
        logger.debug("pair %d started: worker process %d", pair.index, pid)
        if self.stop_level:
            self.stop_pair(pair, self.stop_level)

    def stop_pair(self, pair: _Pair, level: int) -> None:
        fds = self.fds.get(pair.index)
        if fds is None:
            return
        try:
            os.write(fds[1], b"2" if level >= 2 else b"1")
        except OSError:
            pass  # the worker is gone already

    def kill_all(self) -> None:
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while self.workers and time.monotonic() < deadline:
            self.reap(block=True)

    def on_line(self, pair: _Pair, line: str) -> None:
        kind, text = line[:1], line[1:]
        if kind == "R":
            pair.ready = True
            pair.description = text
        elif kind == "S":
            try:
                pair.stats.append(json.loads(text))
            except ValueError:
                pass
        elif kind == "E":
            code, _, message = text.partition("\t")
            pair.error = (int(code or 1), message)

    def read_status(self, index: int) -> bool:
        """Reads what pair `index`'s worker reported; False at end of file."""
        status_r = self.fds[index][0]
        pair = self.pairs[index]
        while True:
            try:
                chunk = os.read(status_r, 65536)
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                chunk = b""
            if not chunk:
                return False
            data = self.buffers[index] + chunk
            *lines, rest = data.split(b"\n")
            self.buffers[index] = rest
            for line in lines:
                self.on_line(pair, line.decode("utf-8", "replace"))

    def reap(self, block: bool = False) -> None:
        while self.workers:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.workers.clear()
                return
            if pid == 0:
                return
            pair = self.workers.pop(pid, None)
            if pair is None:
                continue
            fds = self.fds.pop(pair.index, None)
            if fds is not None:
                # Whatever the worker wrote before it exited is in the pipe: read it all.
                self.fds[pair.index] = fds
                self.read_status(pair.index)
                os.close(fds[0])
                os.close(fds[1])
                del self.fds[pair.index]
            code = os.waitstatus_to_exitcode(status)
            self.pair_ended(pair, f"(pid {pid}) {_describe_exit(status)}", code == 0)
            if block:
                return

    def wait(self, timeout: float) -> None:
        readable = [fds[0] for fds in self.fds.values()]
        try:
            ready, _, _ = select.select(readable, [], [], timeout)
        except InterruptedError:
            ready = []
        for index, fds in list(self.fds.items()):
            if fds[0] in ready:
                self.read_status(index)
        self.reap()

    def worker_main(self, index: int, status_w: int, control_r: int) -> int:
        """The worker process: the single-pair Server on this (main) thread. Returns the exit code."""
        from . import server

        # Until the pair's loop handles them, stop requests come only through the control pipe:
        # a terminal's SIGINT or SIGHUP reaches the whole process group, and the supervisor owns them.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _core.set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self.pid:
            return 1  # the supervisor died before the line above
        if self.pins[index]:
            os.sched_setaffinity(0, self.pins[index])
        server._current_pair = index
        _pair_logging(index, self.config.log_level)

        def report(kind: str, text: str) -> None:
            try:
                os.write(status_w, (kind + text.replace("\n", " ") + "\n").encode())
            except OSError:
                pass

        def take_stop() -> int:
            try:
                data = os.read(control_r, 64)
            except BlockingIOError:
                return 0
            if not data:
                return -1  # the supervisor is gone
            return 2 if b"2" in data else 1

        os.set_blocking(control_r, False)
        config = type(self.config)(**self.settings)
        code, message = 0, ""
        srv: Any = None
        try:
            app = self.app if self.app is not None else server.load_app(config.app, config.app_dir, config.factory)
            srv = server.Server(app, config)
            srv.pair = index
            srv.stats_options = {"stats_region": self.region, "stats_index": index}
            srv.stop_source = (control_r, take_stop)
            srv.on_listening = lambda description: report("R", description)
            srv.run()
        except server.AppLoadError as exc:
            code, message = 2, str(exc)
        except server.StartupError as exc:
            code, message = exc.exit_code, str(exc)
        except Exception as exc:
            traceback.print_exc()
            code, message = 1, f"{type(exc).__name__}: {exc}"
        if srv is not None and srv.stats:
            report("S", json.dumps(srv.stats))
        if code:
            report("E", f"{code}\t{message}")
        return code


def run_interp_pair(argument: str, slot: int) -> tuple[int, str, str]:
    """Runs in pair `slot`'s own sub-interpreter: the single-pair Server. Returns (exit code, message, stats JSON)."""
    try:
        return _run_interp_pair(argument, slot)
    finally:
        _forget_dummy_thread()


def _run_interp_pair(argument: str, slot: int) -> tuple[int, str, str]:
    from . import server

    settings = json.loads(argument)
    index = settings.pop("pair")
    class_name = settings.pop("config_class")
    page_address = settings.pop("stats_page_address")
    server._current_pair = index
    _pair_logging(index, settings["log_level"])
    config = _make_config(class_name, settings)
    try:
        app = server.load_app(config.app, config.app_dir, config.factory)
    except server.AppLoadError as exc:
        return 2, str(exc), "{}"
    except Exception as exc:
        traceback.print_exc()
        return 1, f"importing {config.app!r} raised {type(exc).__name__}: {exc}", "{}"
    srv = server.Server(app, config)
    srv.pair = index
    srv.stats_options = {"stats_page_address": page_address, "stats_index": index}
    srv.stop_source = (_core.interp_stop_fd(slot), lambda: _core.interp_take_stop(slot))
    srv.on_listening = lambda description: _core.interp_report_ready(slot, description)
    try:
        srv.run()
    except server.StartupError as exc:
        return exc.exit_code, str(exc), json.dumps(srv.stats)
    except BaseException as exc:  # noqa: BLE001 - the pair's thread must report, whatever happened
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}", json.dumps(srv.stats)
    return 0, "", json.dumps(srv.stats)


class _InterpSupervisor(_Supervisor):
    """One own-GIL sub-interpreter (on its own native thread) per pair, in this process."""

    isolation = "subinterpreters"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.slots: dict[int, int] = {}  # pair index -> slot id
        self.left_alive = 0  # interpreters that could not be ended

    def start_pair(self, pair: _Pair) -> None:
        settings = dict(self.settings, pair=pair.index, config_class=_config_class_name(self.config),
                        stats_page_address=self.region.address(pair.index))
        self.slots[pair.index] = _core.interp_start(
            "cadeloop._supervisor", "run_interp_pair", json.dumps(settings), self.pins[pair.index], THREAD_GRACE
        )
        pair.mark_started()
        logger.debug("pair %d started: sub-interpreter thread (slot %d)", pair.index, self.slots[pair.index])
        if self.stop_level:
            _core.interp_request_stop_all(self.stop_level)

    def stop_pair(self, pair: _Pair, level: int) -> None:
        _core.interp_request_stop_all(level)  # one registry for the process: every pair at once

    def kill_all(self) -> None:
        # Threads cannot be killed: the process exits without finalizing (see run_pairs).
        for pair in self.pairs:
            if pair.running:
                pair.running = False
                self.left_alive += 1

    def wait(self, timeout: float) -> None:
        running = [i for i, p in enumerate(self.pairs) if p.running]
        if running:
            # One slice on one pair (GIL released); the others are looked at below.
            _core.interp_wait(self.slots[running[0]], timeout, not self.pairs[running[0]].ready)
        else:
            time.sleep(timeout)
        for index in running:
            pair = self.pairs[index]
            slot = self.slots[index]
            ready, finished, ended, description, code, message, stats = _core.interp_status(slot)
            if ready and not pair.ready and not finished:
                pair.ready = True
                pair.description = description
            if finished:
                _core.interp_release(slot)
                del self.slots[index]
                if not ended:
                    self.left_alive += 1
                try:
                    if stats:
                        pair.stats.append(json.loads(stats))
                except ValueError:
                    pass
                if code:
                    pair.error = (code, message)
                how = "stopped" if code == 0 else f"ended with code {code}"
                self.pair_ended(pair, how, code == 0 and ended)


# --------------------------------------------------------------------------- entry


def run_pairs(config: Any, app: Any = None) -> dict[str, Any]:
    """Serves config.app on resolve_cores(config.cores) pairs until stopped; returns the counters.

    Raises StartupError (one line) when the server cannot start or a pair
    failed; the caller prints it and exits with its code.
    """
    from . import server

    n = resolve_cores(config.cores)
    if n == 1:
        if config.pin:
            os.sched_setaffinity(0, pin_sets(1)[0])  # the I/O thread, started later, inherits it
        one = dataclasses.replace(config, cores=1)
        srv = server.Server(app if app is not None else server.load_app(config.app, config.app_dir, config.factory),
                            one)
        srv.run()
        return srv.stats
    if config.uds is not None or config.fd is not None:
        raise server.StartupError(
            f"--cores {config.cores}: more than one core pair needs a TCP address (--host/--port); "
            "--uds and --fd serve one pair", 2)
    isolation, why = choose_isolation(config)
    logger.info("isolation %s (%s)", isolation, why)
    reserved = server._bind_reuseport(config)
    port = reserved.getsockname()[1]
    if isolation == "processes":
        if app is None:
            app = server.load_app(config.app, config.app_dir, config.factory)
        supervisor: _Supervisor = _ProcessSupervisor(config, app, n, port, reserved)
    else:
        supervisor = _InterpSupervisor(config, None, n, port, reserved)
    supervisor.run()
    if config.access_log:
        _core.flush_access_logs(max(config.grace, 1.0))
    stats = merge_stats({p.index: p.stats for p in supervisor.pairs}, isolation)
    # The shared pages hold every pair's latest counters (a restarted worker starts its page
    # afresh); the histograms merge there, which summing per-worker dicts cannot do.
    from ._stats import region_stats

    stats["region"] = region_stats(supervisor.region, isolation)
    s = stats
    logger.info("stopped: %d core pairs, %d requests, %d responses", n, s.get("requests", 0), s.get("responses", 0))
    if config.stats_json_on_exit:
        _write_json(config.stats_json_on_exit, stats)
    left_alive = getattr(supervisor, "left_alive", 0)
    if left_alive:
        # A sub-interpreter still runs a thread the app started: ending or finalizing would abort
        # (3.12) or skip its finally blocks (3.13). Leave without finalizing.
        message = supervisor.failure[1] if supervisor.failure else "a core pair did not end"
        sys.stderr.flush()
        _core.log(logging.ERROR, f"{message}; {left_alive} interpreter(s) left running, exiting without finalizing")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(supervisor.failure[0] if supervisor.failure else 1)
    if supervisor.failure is not None:
        raise server.StartupError(supervisor.failure[1], supervisor.failure[0])
    return stats
