"""The supervisor: N core pairs on the main thread, started, stopped and restarted by one policy.

`Supervisor` holds what both isolation modes share: the signals
(SIGINT/SIGTERM/SIGHUP belong to the main thread of the main interpreter),
the stop levels (1 drain, 2 drain cut short: a second SIGINT or SIGTERM), restarting a pair that died
and giving up on one that keeps dying at start, the stats region and
endpoint, and the "listening" line once every pair is up. Where each pair's
interpreter lives is a subclass's business: `cadeloop._workers` (one forked
worker process per pair) and `cadeloop._subinterpreters` (one own-GIL
sub-interpreter per pair), which `cadeloop._host` runs in serving processes
that it restarts as workers are; `cadeloop.server` picks one.

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

__all__ = [
    "START_WINDOW", "GIVE_UP_AFTER", "GIVE_UP_WINDOW", "THREAD_GRACE", "CUT_GRACE", "SupervisedPair", "Supervisor",
]

#: A pair that dies sooner than this (seconds) after it was started died "at start".
START_WINDOW = 10.0
#: A pair that died at start this many times within GIVE_UP_WINDOW seconds is given up on.
GIVE_UP_AFTER = 5
GIVE_UP_WINDOW = 60.0
#: Seconds threads an app started get to end after its pair stopped, before its interpreter ends.
THREAD_GRACE = 5.0
#: Seconds the pairs get after a second SIGINT/SIGTERM (their tasks cancelled) before they are killed:
#: more than the 2 s a connection lingers after its last response, so a pair whose app took the
#: cancellation ends by itself.
CUT_GRACE = 3.0


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
        #: How the log names it: "pair 3", or the pairs a serving process holds.
        self.label = f"pair {index}"
        #: What the pair said just before it ended (a Python-level os._exit and where it was called).
        self.last_words = ""
        #: It ended after serving limit_max_requests: replace it, no death counted.
        self.replaced = False
        #: Its supervisor asked it to drain to be replaced (worker processes: one pair at a time).
        self.replace_asked = False

    def mark_started(self) -> None:
        """A worker or interpreter for this pair was just started."""
        self.running = True
        self.ready = False
        self.error = None
        self.last_words = ""
        self.replaced = False
        self.replace_asked = False
        self.started_at = time.monotonic()
        self.starts += 1


class Supervisor:
    """Runs N pairs on the main thread until a stop; subclasses say where each pair's interpreter lives."""

    isolation = ""
    #: Whether run() takes SIGINT/SIGTERM/SIGHUP (False where a parent process owns them).
    owns_signals = True

    def __init__(self, config: Any, app: Any, n: int, port: int, reserved: socket.socket | None,
                 region: Any = None) -> None:
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
        self.region = region if region is not None else _core.StatsRegion(n)
        self.endpoint: Any = None
        #: Pairs (or serving processes) restarted after they died; /stats and /metrics count them too.
        self.restarts = 0
        #: Pairs whose interpreter could not be ended (sub-interpreters only): the process must not finalize.
        self.left_alive = 0
        #: When the drain begins after a first signal with drain_delay (time.monotonic()), else None.
        self.drain_at: float | None = None

    def stats_by_pair(self) -> dict[int, list[dict[str, Any]]]:
        """Each pair's counters at exit, one dict per worker or interpreter it ran in."""
        return {p.index: p.stats for p in self.pairs}

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
        if signum == signal.SIGHUP and getattr(self.config, "ssl_certfile", None) is not None:
            self.reload_tls()  # with TLS on, SIGHUP re-reads the certificate (docs/operations.md)
            return
        if self.stop_level == 0 and self.drain_at is not None:
            # A second signal during drain_delay: no delay left, and the drain is cut short too.
            logger.info("%s again: cutting the drain short", name)
            self.drain_at = None
            self.request_stop(2)
        elif self.stop_level == 0 and self.config.drain_delay > 0:
            self.drain_at = time.monotonic() + self.config.drain_delay
            if self.endpoint is not None:
                self.endpoint.set_draining()  # /readyz says 503 while every pair still serves
            logger.info("%s: /readyz answers 503; serving on for drain_delay %gs, then shutting down", name,
                        self.config.drain_delay)
        elif self.stop_level == 0:
            logger.info("%s: shutting down %d core pairs: finishing requests in flight (grace %gs)",
                        name, len(self.region), self.config.grace)
            self.request_stop(1)
        elif self.stop_level < 2:
            logger.info("%s again: cutting the drain short", name)
            self.request_stop(2)

    def reload_tls(self) -> None:
        """Every serving process re-reads the TLS certificate and key (each logs the outcome)."""
        pids = list(getattr(self, "pids", {}).values())
        logger.info("SIGHUP: re-reading the TLS certificate and key in %d serving process%s",
                    len(pids), "" if len(pids) == 1 else "es")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGHUP)
            except ProcessLookupError:
                pass

    def request_stop(self, level: int) -> None:
        if self.stop_level == 0:
            self.stop_deadline = time.monotonic() + self.config.grace + THREAD_GRACE + 10.0
            if self.endpoint is not None:
                self.endpoint.set_draining()  # /readyz says 503 before the listeners close
        if level >= 2 and self.stop_level < 2:
            # The drain cut short: the app's tasks are cancelled; a pair still running after
            # CUT_GRACE (an app thread blocked outside the loop) is killed.
            self.stop_deadline = min(self.stop_deadline, time.monotonic() + CUT_GRACE)
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
        if pair.last_words and not clean:
            detail += f" ({pair.last_words})"
        label = pair.label
        if self.stop_level:
            if not clean:
                logger.error("%s %s while shutting down%s", label, how, detail)
                self.failure = self.failure or (1, f"{label} {how} while shutting down{detail}")
            return
        if pair.replaced and clean:
            logger.info("%s served limit_max_requests: replacing it", label)
            pair.restart_at = time.monotonic()
            return
        if pair.error is not None and not self.up:
            # The app failed to start (import, lifespan, address): stop the server with its message.
            self.failure = pair.error
            logger.info("%s failed to start; stopping the other pairs", label)
            self.request_stop(1)
            return
        now = time.monotonic()
        if not was_ready or now - pair.started_at < START_WINDOW:
            pair.deaths = [t for t in pair.deaths if now - t < GIVE_UP_WINDOW] + [now]
        if len(pair.deaths) >= GIVE_UP_AFTER:
            pair.given_up = True
            logger.error("%s %s%s; it died %d times within %gs of starting: giving up on it",
                         label, how, detail, len(pair.deaths), GIVE_UP_WINDOW)
            if all(p.given_up for p in self.pairs):
                self.failure = (1, f"every core pair kept dying at start (last: {label} {how}{detail})")
                self.request_stop(1)
            return
        delay = 0.0 if len(pair.deaths) <= 1 else min(0.1 * 2 ** (len(pair.deaths) - 2), 2.0)
        logger.error("%s %s%s; restarting it", label, how, detail)
        pair.restart_at = now + delay
        self.restarts += 1
        if self.endpoint is not None:
            self.endpoint.count_restart()

    def run(self) -> None:
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if self.owns_signals else ()
        previous = {sig: signal.signal(sig, self.on_signal) for sig in signals}
        try:
            self.endpoint = start_endpoint(self.config, self.region, self.isolation)
            for pair in self.pairs:
                self.start_pair(pair)
            while any(p.running or p.restart_at is not None for p in self.pairs):
                now = time.monotonic()
                if self.drain_at is not None and now >= self.drain_at:
                    self.drain_at = None
                    logger.info("drain_delay over: shutting down %d core pairs: finishing requests in flight "
                                "(grace %gs)", len(self.region), self.config.grace)
                    self.request_stop(1)
                for pair in self.pairs:
                    if pair.restart_at is not None and now >= pair.restart_at and not self.stop_level:
                        pair.restart_at = None
                        self.start_pair(pair)
                if not self.up and not self.stop_level and all(p.ready or p.given_up for p in self.pairs):
                    self.up = True
                    self.announce()
                if self.stop_level and now > self.stop_deadline:
                    if self.stop_level >= 2:
                        logger.error("core pairs did not stop within %gs of the second signal; killing them",
                                     CUT_GRACE)
                        self.failure = self.failure or (1, "core pairs did not stop after the second signal; killed")
                    else:
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
        logger.info("listening on %s://%s (%d core pairs, isolation %s, pid %d)",
                    self.config.scheme(), described, len(live), self.isolation, os.getpid())
