"""The supervisor: N core pairs on the main thread, started, stopped and restarted by one policy.

`Supervisor` holds what both isolation modes share: the signals
(SIGINT/SIGTERM/SIGHUP belong to the main thread of the main interpreter),
the stop levels (1 drain, 2 drain cut short), restarting a pair that died
and giving up on one that keeps dying at start, the stats region and
endpoint, and the "listening" line once every pair is up. Where each pair's
interpreter lives is a subclass's business: `cadeloop._workers` (one forked
worker process per pair) and `cadeloop._subinterpreters` (one own-GIL
sub-interpreter per pair); `cadeloop.server` picks one.

Nothing Python crosses an interpreter: a pair gets its settings as
JSON-able data and reports back plain strings and ints.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from typing import Any

from . import _core
from ._cpus import pin_sets
from ._log import logger
from ._stats import start_endpoint

__all__ = ["START_WINDOW", "GIVE_UP_AFTER", "GIVE_UP_WINDOW", "THREAD_GRACE", "SupervisedPair", "Supervisor"]

#: A pair that dies sooner than this (seconds) after it was started died "at start".
START_WINDOW = 10.0
#: A pair that died at start this many times within GIVE_UP_WINDOW seconds is given up on.
GIVE_UP_AFTER = 5
GIVE_UP_WINDOW = 60.0
#: Seconds threads an app started get to end after its pair stopped, before its interpreter ends.
THREAD_GRACE = 5.0


def _pair_settings(config: Any, port: int) -> dict[str, Any]:
    """The settings of one pair (as JSON-able data): the server's, for one pair on the chosen port."""
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    settings.update(cores=1, port=port, stats_json_on_exit=None)
    return settings


class SupervisedPair:
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


class Supervisor:
    """Runs N pairs on the main thread until a stop; subclasses say where each pair's interpreter lives."""

    isolation = ""

    def __init__(self, config: Any, app: Any, n: int, port: int, reserved: socket.socket | None) -> None:
        self.config = config
        self.app = app
        self.pairs = [SupervisedPair(i) for i in range(n)]
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
        #: Pairs whose interpreter could not be ended (sub-interpreters only): the process must not finalize.
        self.left_alive = 0

    # --- to implement
    def start_pair(self, pair: SupervisedPair) -> None:
        raise NotImplementedError

    def stop_pair(self, pair: SupervisedPair, level: int) -> None:
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

    def pair_ended(self, pair: SupervisedPair, how: str, clean: bool) -> None:
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
