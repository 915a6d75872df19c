"""Core pairs in worker processes: one forked worker per pair, each serving on its main thread.

The isolation of CPython 3.11 and 3.12, and of an app whose extension
modules refuse sub-interpreters. The supervisor forks every worker before
any thread exists; each worker runs a `PairServer` on its main thread with
its own SO_REUSEPORT listener on the same port. A worker reports over a
pipe ("R" listening, "S" counters, "E" a start-up failure); the supervisor
forwards stop requests over another, whose end of file also stops a worker
whose supervisor is gone (PR_SET_PDEATHSIG backs that up).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import sys
import time
import traceback
from typing import Any

from . import _core
from ._errors import AppLoadError, StartupError
from ._log import configure_pair_logging, logger
from ._pair import PairServer, load_app, record_os_exit, set_current_pair
from ._supervisor import SupervisedPair, Supervisor

__all__ = ["ProcessSupervisor"]

# The worker's own exit, which record_os_exit() must not report as the app's.
_real_exit = os._exit


def _describe_exit(status: int) -> str:
    """How a worker ended, for the log line: "killed by SIGKILL", "exited with code 1"."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ("R", "S", "T" for stopped...), "" when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:][:1].decode()
    except (OSError, ValueError):
        return ""


class ProcessSupervisor(Supervisor):
    """One forked worker process per pair."""

    isolation = "processes"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.workers: dict[int, SupervisedPair] = {}  # pid -> pair
        self.fds: dict[int, tuple[int, int]] = {}  # pair index -> (status_r, control_w)
        self.buffers: dict[int, bytes] = {}
        self.pids: dict[int, int] = {}  # pair index -> pid
        self.killed_by_watchdog: set[int] = set()  # pids the watchdog killed (each once)

    def start_pair(self, pair: SupervisedPair) -> None:
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
                    _real_exit(code)
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

    def stop_pair(self, pair: SupervisedPair, level: int) -> None:
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

    def on_line(self, pair: SupervisedPair, line: str) -> None:
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
        elif kind == "W":
            pair.last_words = text
        elif kind == "X":
            pair.replaced = True
            self.replace_next()

    def replace_next(self) -> None:
        """Stops one pair that served limit_max_requests, when no other is being replaced and every other
        serves: its SO_REUSEPORT listener closes while the others' stay open, so none is refused."""
        if self.stop_level or any(p.replace_asked for p in self.pairs if p.running):
            return
        waiting = [p for p in self.pairs if p.running and p.replaced and not p.replace_asked]
        others_serving = all(p.ready or p.given_up for p in self.pairs if p not in waiting[:1])
        if waiting and others_serving:
            waiting[0].replace_asked = True
            self.stop_pair(waiting[0], 1)

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
            self.killed_by_watchdog.discard(pid)
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
        self.replace_next()  # a replacement now serving lets the next pair waiting for one go
        self.watch()

    def unit_pages(self, unit: SupervisedPair) -> list[int]:
        """The stats pages (pair indices) of the pairs `unit`'s process runs."""
        return [unit.index]

    def watch(self) -> None:
        """The watchdog's last resort: kills a process that stopped beating or whose every pair stays stuck.

        A pair's I/O thread beats in its stats page (see io_thread_watchdog.cpp) and marks the
        pair stuck when its app thread makes no progress for `stuck_timeout` while it has work.
        A process whose I/O threads stopped beating for that long (SIGSTOP, a frozen process) or
        whose every pair stayed stuck for two more `stuck_timeout`s (no progress for three) serves
        nobody: it is killed, and restarted as any dead process is. A pair that progresses
        sooner resumes by itself.
        """
        timeout_ms = float(self.config.stuck_timeout or 0) * 1000.0
        if timeout_ms <= 0 or self.stop_level:
            return
        now_ms = time.monotonic() * 1000.0
        for pid, unit in list(self.workers.items()):
            if not unit.ready or pid in self.killed_by_watchdog:
                continue
            pages = [self.region.snapshot(i) for i in self.unit_pages(unit)]
            pages = [p for p in pages if p["valid"] and p["pid"] == pid and p["state"] in ("serving", "stuck")]
            if not pages:
                continue
            why = ""
            quiet = max(now_ms - p["io_beat_ms"] for p in pages if p["io_beat_ms"]) if any(
                p["io_beat_ms"] for p in pages) else 0.0
            if quiet > timeout_ms + 1000.0:  # a beat is due every second at most
                state = _process_state(pid)
                why = (f"stopped beating for {quiet / 1000:.1f}s"
                       + (" (the process is stopped)" if state == "T" else " (its I/O threads are frozen)"))
            elif all(p["state"] == "stuck" and p["stuck_since_ms"]
                     and now_ms - p["stuck_since_ms"] >= 2 * timeout_ms for p in pages):
                stuck = min(now_ms - p["stuck_since_ms"] for p in pages) + timeout_ms
                why = f"made no progress for {stuck / 1000:.1f}s (stuck)"
            if why:
                logger.error("%s (pid %d) %s; the watchdog kills it", unit.label, pid, why)
                self.killed_by_watchdog.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def worker_main(self, index: int, status_w: int, control_r: int) -> int:
        """The worker process: a PairServer on this (main) thread. Returns the exit code."""
        # Until the pair's loop handles them, stop requests come only through the control pipe:
        # a terminal's SIGINT or SIGHUP reaches the whole process group, and the supervisor owns them.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _core.set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self.pid:
            return 1  # the supervisor died before the line above
        if self.pins[index]:
            os.sched_setaffinity(0, self.pins[index])
        set_current_pair(index)
        configure_pair_logging(index, self.config.log_level)
        record_os_exit(status_w, "W")
        # A segfault in the app: its Python stack on stderr before the supervisor's line. Imported
        # here: faulthandler refuses to load in a sub-interpreter, which imports this module too.
        import faulthandler

        faulthandler.enable()

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
            app = self.app if self.app is not None else load_app(config.app, config.app_dir, config.factory)
            srv = PairServer(app, config)
            srv.pair = index
            srv.stats_options = {"stats_region": self.region, "stats_index": index}
            srv.stop_source = (control_r, take_stop)
            srv.on_listening = lambda description: report("R", description)
            srv.on_max_requests = lambda: report("X", "")
            srv.run()
        except AppLoadError as exc:
            code, message = 2, str(exc)
        except StartupError as exc:
            code, message = exc.exit_code, str(exc)
        except Exception as exc:
            traceback.print_exc()
            code, message = 1, f"{type(exc).__name__}: {exc}"
        if srv is not None and srv.stats:
            report("S", json.dumps(srv.stats))
        if srv is not None and srv.replaced and not code:
            report("X", "")  # limit_max_requests: drained to be replaced
        if code:
            report("E", f"{code}\t{message}")
        return code
