"""Sub-interpreter pairs in a serving process, under a parent that keeps the listening sockets.

With own-GIL sub-interpreters (CPython 3.13+) every pair could live in the
process the user started; then one `os._exit` or one segfault in any pair
ends the whole server, silently. Instead, that process becomes the parent:
it binds one SO_REUSEPORT listening socket per pair, keeps the signals, the
stats endpoint and the shared stats region, and forks a serving process that
runs the pairs (an `InterpSupervisor`, one sub-interpreter per pair, each pair
serving its inherited socket). The parent is a `ProcessSupervisor` whose unit
is a serving process instead of a pair, so a death is handled exactly as a
worker's: one log line naming how (exit code or signal, and the pair's
`os._exit` call when there was one), a restart counted and made at once,
backed off when it keeps dying. While no serving process runs, the kernel
queues new connections on the sockets the parent still holds; the next
serving process accepts them.

The pairs can be spread over more than one serving process
(`HostSupervisor(groups=...)`): a crash then takes only that process's pairs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
from typing import Any

from . import _core
from ._log import logger
from ._pair import bind_reuseport
from ._subinterpreters import InterpSupervisor
from ._supervisor import SupervisedPair
from ._workers import ProcessSupervisor

__all__ = ["SERVING_PROCESSES", "HostSupervisor", "split_pairs"]

#: The default of the serving_processes setting (fewer with fewer pairs). Two: a crash takes
#: half the pairs and the other half keeps the port answering while it restarts.
SERVING_PROCESSES = 2


def split_pairs(n: int, processes: int) -> list[list[int]]:
    """Pair indices 0..n-1 in `processes` groups (at least one pair each), as even as can be."""
    processes = max(1, min(processes, n))
    return [list(range(n))[g::processes] for g in range(processes)]


def _describe_group(group: list[int]) -> str:
    if len(group) == 1:
        return f"pair {group[0]}"
    return "pairs " + ", ".join(str(i) for i in group)


class _ServedInterpSupervisor(InterpSupervisor):
    """The serving process's pairs: stop requests come from the parent's pipe, not signals."""

    owns_signals = False

    def __init__(self, *args: Any, sockets: list[int], status_w: int, control_r: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sockets = sockets
        self.status_w = status_w
        self.control_r = control_r

    def report(self, kind: str, text: str) -> None:
        try:
            os.write(self.status_w, (kind + text.replace("\n", " ") + "\n").encode())
        except OSError:
            pass

    def pair_settings(self, pair: SupervisedPair) -> dict[str, Any]:
        settings = super().pair_settings(pair)
        # A copy of the parent's socket: the pair's listener closes it when the pair ends,
        # and a pair restarted in this process gets a fresh copy.
        settings.update(fd=os.dup(self.sockets[pair.index]), last_words_fd=self.status_w,
                        listen_backlog=self.config.backlog)
        return settings

    def wait(self, timeout: float) -> None:
        super().wait(timeout)
        try:
            data = os.read(self.control_r, 64)
        except BlockingIOError:
            return
        if not data:
            level = 1  # the parent is gone: drain and end
        else:
            level = 2 if b"2" in data else 1
        if level > self.stop_level:
            self.request_stop(level)

    def announce(self) -> None:
        self.report("R", ", ".join(p.description for p in self.pairs))


class HostSupervisor(ProcessSupervisor):
    """The parent: listening sockets, signals, stats; one or more serving processes of sub-interpreter pairs."""

    isolation = "subinterpreters"

    def __init__(self, config: Any, n: int, port: int, reserved: socket.socket | None,
                 groups: list[list[int]]) -> None:
        super().__init__(config, None, len(groups), port, reserved, _core.StatsRegion(n))
        self.n = n
        self.groups = groups
        for unit, group in zip(self.pairs, groups):
            unit.label = f"the serving process of {_describe_group(group)}"
        self.pair_stats: dict[int, list[dict[str, Any]]] = {i: [] for i in range(n)}
        # One listening socket per pair, bound here and kept across serving processes.
        self.sockets: list[socket.socket] = []
        try:
            for _ in range(n):
                self.sockets.append(self.listen_socket())
        except BaseException:
            self.close_sockets()
            raise

    def listen_socket(self, listen: bool = True) -> socket.socket:
        """A new socket on the port (SO_REUSEPORT), listening unless `listen` is False."""
        s = bind_reuseport(dataclasses.replace(self.config, port=self.port))
        try:
            if listen:
                s.listen(self.config.backlog)
        except BaseException:
            s.close()
            raise
        return s

    def pair_ended(self, pair: SupervisedPair, how: str, clean: bool) -> None:
        group = self.groups[pair.index]
        if not self.stop_level and self.sockets and any(p.running and p.ready for p in self.pairs if p is not pair):
            # Another serving process is up: give the dead one's pairs new sockets, so the kernel
            # sends new connections to the live pairs at once instead of queueing them for the
            # restart (the connections queued on the old ones are reset, as a dead worker's are).
            # The new sockets are only bound: each pair listens once its app is imported, so no
            # connection waits for a pair still starting. With no other process up, the old
            # sockets stay: they queue for the restart.
            for i in group:
                try:
                    fresh = self.listen_socket(listen=False)
                except Exception as exc:  # noqa: BLE001 - keep the old socket rather than none
                    logger.warning("pair %d keeps its listening socket: %s", i, exc)
                    continue
                self.sockets[i].close()
                self.sockets[i] = fresh
        super().pair_ended(pair, how, clean)

    def unit_pages(self, unit: SupervisedPair) -> list[int]:
        return self.groups[unit.index]

    def close_sockets(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets = []

    def request_stop(self, level: int) -> None:
        super().request_stop(level)
        # The serving processes close their copies as they drain; with these closed too,
        # a new connection is refused instead of queued for nobody.
        self.close_sockets()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.close_sockets()

    def stats_by_pair(self) -> dict[int, list[dict[str, Any]]]:
        return self.pair_stats

    def on_line(self, pair: SupervisedPair, line: str) -> None:
        if line[:1] == "S":
            try:
                data = json.loads(line[1:])
                self.pair_stats[int(data["pair"])].append(data["stats"])
            except (ValueError, KeyError, TypeError):
                pass
            return
        super().on_line(pair, line)

    def announce(self) -> None:
        live = sum(len(g) for unit, g in zip(self.pairs, self.groups) if not unit.given_up)
        described = dataclasses.replace(self.config, port=self.port).describe_listen()
        logger.debug("pairs in %d serving process%s: %s", len(self.groups), "" if len(self.groups) == 1 else "es",
                     "; ".join(_describe_group(g) for g in self.groups))
        # The line as the one-process mode wrote it (scripts and tests wait for it).
        logger.info("listening on %s://%s (%d core pairs, isolation %s, pid %d)",
                    self.config.scheme(), described, live, self.isolation, os.getpid())

    def worker_main(self, index: int, status_w: int, control_r: int) -> int:
        """The serving process: the pairs of group `index` as sub-interpreters. Returns the exit code."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the parent owns them; it stops us through control_r
        if self.config.ssl_certfile is not None:  # the parent forwards SIGHUP: re-read the TLS files
            _core.tls_reload_on_signal(signal.SIGHUP)
        # No parent-death signal: when the parent is gone, the end of the control pipe drains us.
        if os.getppid() != self.pid:
            return 1
        # A segfault in any pair: Python's stack of the crashing thread on stderr, then the parent's line.
        # (Imported here: faulthandler refuses to load in the pairs' sub-interpreters, which
        # import this module with the package.)
        import faulthandler

        faulthandler.enable(all_threads=False)
        os.set_blocking(control_r, False)
        # Only this group's sockets: another group's must die with its own process and the parent.
        mine = set(self.groups[index])
        fds = [s.fileno() for s in self.sockets]
        for i, s in enumerate(self.sockets):
            if i not in mine:
                s.close()
        config = dataclasses.replace(self.config, stats_port=None)
        served = _ServedInterpSupervisor(
            config, None, self.n, self.port, None, self.region,
            sockets=fds, status_w=status_w, control_r=control_r,
        )
        served.pairs = [served.pairs[i] for i in self.groups[index]]
        served.run()
        for pair in served.pairs:
            for stats in pair.stats:
                served.report("S", json.dumps({"pair": pair.index, "stats": stats}))
        code = 0
        if served.failure is not None:
            code = served.failure[0] or 1
            served.report("E", f"{code}\t{served.failure[1]}")
        elif served.left_alive:
            code = 1
        if served.left_alive:
            # As the one-process mode says it; this process exits without finalizing anyway.
            message = served.failure[1] if served.failure else "a core pair did not end"
            logger.error("%s; %d interpreter(s) left running, exiting without finalizing", message,
                         served.left_alive)
        return code
