"""One core pair: load the app, bind, and serve it on this thread until stopped.

The core pair's native I/O thread (listener, HTTP/1.1 connections, limits,
timeouts, pipelining, response writes) runs in C++ and never touches Python.
The app thread is the thread that calls `PairServer.run()`: it runs a
cadeloop.Loop to which the pair's inbound ring is attached
(`_core.ServerCore`, C++), so requests are drained, their scopes built and
their app coroutines started eagerly inside the loop's own pass. This module
holds what is naturally Python about one pair: loading the app, the lifespan
protocol, signals and the order of start-up and shutdown. It knows nothing of
other pairs; the supervisors run one `PairServer` per worker process or
sub-interpreter, and `cadeloop.server` runs one on the calling thread.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import _core
from ._admission import admit, max_requests_for_pair
from ._errors import AppLoadError, ClientDisconnected, StartupError
from ._log import apply_log_level, error_logger, logger
from ._loop import Loop
from ._stats import start_endpoint, write_json
from .config import Config

__all__ = ["load_app", "bind_reuseport", "current_pair", "set_current_pair", "record_os_exit", "PairServer"]

# --------------------------------------------------------------------------- the app


def load_app(spec: Any, app_dir: str | None = None, factory: bool = False) -> Callable[..., Any]:
    """The ASGI app that `spec` names ("module:attr", "module:obj.attr") or `spec` itself.

    A module or attribute that does not exist raises AppLoadError with one
    line; an exception raised by the app's own import propagates unchanged.
    """
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise AppLoadError(f"APP must look like 'module:attribute', not {spec!r}")
        path = os.path.abspath(app_dir) if app_dir is not None else os.getcwd()
        if path not in sys.path:
            sys.path.insert(0, path)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing == module_name or module_name.startswith(missing + "."):
                raise AppLoadError(f"cannot import module {module_name!r} ({exc})") from None
            raise
        obj: Any = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    else:
        obj = spec
    if factory:
        if not callable(obj):
            raise AppLoadError(f"--factory: {spec!r} is not callable")
        obj = obj()
    if not callable(obj):
        raise AppLoadError(f"{spec!r} is not an ASGI app (got {type(obj).__name__}, which is not callable)")
    return obj  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- lifespan


class _Lifespan:
    """The ASGI lifespan protocol: startup before accepting, shutdown after the last request."""

    def __init__(self, app: Any, mode: str, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.mode = mode
        self.loop = loop
        self.state: dict[str, Any] | None = {} if mode != "off" else None
        self.running = False
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.startup_done: asyncio.Future[tuple[bool, str]] = loop.create_future()
        self.shutdown_done: asyncio.Future[tuple[bool, str]] = loop.create_future()
        self.task: asyncio.Task[None] | None = None

    async def _receive(self) -> dict[str, Any]:
        return await self.queue.get()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "lifespan.startup.complete":
            self._set(self.startup_done, (True, ""))
        elif kind == "lifespan.startup.failed":
            self._set(self.startup_done, (False, str(message.get("message", ""))))
        elif kind == "lifespan.shutdown.complete":
            self._set(self.shutdown_done, (True, ""))
        elif kind == "lifespan.shutdown.failed":
            self._set(self.shutdown_done, (False, str(message.get("message", ""))))
        else:
            raise RuntimeError(f"unexpected ASGI message type {kind!r} in the lifespan protocol")

    @staticmethod
    def _set(fut: asyncio.Future[tuple[bool, str]], value: tuple[bool, str]) -> None:
        if not fut.done():
            fut.set_result(value)

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        await self.app(scope, self._receive, self._send)

    async def startup(self) -> None:
        if self.mode == "off":
            return
        self.task = self.loop.create_task(self._main())
        self.queue.put_nowait({"type": "lifespan.startup"})
        await asyncio.wait([self.startup_done, self.task], return_when=asyncio.FIRST_COMPLETED)
        if self.startup_done.done():
            ok, message = self.startup_done.result()
            if not ok:
                raise StartupError(f"lifespan startup failed: {message}" if message else "lifespan startup failed", 3)
            self.running = True
            logger.debug("lifespan startup complete")
            return
        exc = self.task.exception()
        self.state = None
        if self.mode == "auto":
            logger.info("the app does not support the ASGI lifespan protocol (%s); serving without it",
                        f"{type(exc).__name__}: {exc}" if exc is not None else "it returned at once")
            return
        if exc is not None:
            error_logger.error("Exception in ASGI lifespan startup", exc_info=exc)
            raise StartupError(f"lifespan startup raised {type(exc).__name__}: {exc}", 3)
        raise StartupError("lifespan startup: the app returned without completing startup", 3)

    async def shutdown(self) -> None:
        if not self.running or self.task is None:
            return
        self.running = False
        self.queue.put_nowait({"type": "lifespan.shutdown"})
        await asyncio.wait([self.shutdown_done, self.task], return_when=asyncio.FIRST_COMPLETED)
        if self.shutdown_done.done():
            ok, message = self.shutdown_done.result()
            if not ok:
                logger.error("lifespan shutdown failed: %s", message)
            else:
                logger.debug("lifespan shutdown complete")
        elif self.task.exception() is not None:
            error_logger.error("Exception in ASGI lifespan shutdown", exc_info=self.task.exception())
        if not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 1.0)
            except (asyncio.TimeoutError, Exception):
                pass


# --------------------------------------------------------------------------- the address


def _probe_listen(config: Config) -> None:
    """Refuses an address already taken before the app's startup runs (the pair binds for real later)."""
    if config.uds is not None or config.fd is not None or config.port == 0:
        return
    bind_reuseport(config).close()


def bind_reuseport(config: Config) -> socket.socket:
    """A socket bound (not listening) to config's TCP address with SO_REUSEPORT, as every pair binds.

    With port 0 the kernel picks the port; keeping this socket bound keeps
    that port for every pair (and for a restarted worker) until it is closed.
    Raises StartupError with one line when the address is taken.
    """
    try:
        infos = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {config.describe_listen()}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(addr)
    except OSError as exc:
        s.close()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        reason = reason[:1].lower() + reason[1:]
        raise StartupError(f"cannot listen on {config.describe_listen()}: {reason}") from None
    return s


# --------------------------------------------------------------------------- which pair this is

# The index of the core pair this interpreter (or worker process) serves; see current_pair().
_current_pair: int | None = None


def current_pair() -> int | None:
    """The index (0 .. cores-1) of the core pair the calling code runs in, or None outside a server.

    Each pair has its own interpreter (a sub-interpreter, or the main
    interpreter of its worker process), so this is a plain module value: an
    app may read it at import, in lifespan or in a request.
    """
    return _current_pair


def set_current_pair(index: int) -> None:
    """Records which pair this interpreter serves. The pair's app thread, before the app is imported."""
    global _current_pair
    _current_pair = index


def record_os_exit(fd: int, prefix: str) -> None:
    """Makes this interpreter's `os._exit` write one last-words line to `fd` before it exits.

    `os._exit` skips every handler and raises no audit event, so a pair that
    calls it would vanish without a word; the supervisor reads the line
    (`prefix` + "pair 1 called os._exit(1) at app.py:12") and names the
    call in its log line. Each interpreter has its own `os` module: this
    touches only the calling pair's. The pair's thread, before the app is
    imported.
    """
    real_exit = os._exit
    pair = current_pair()

    def _exit(code: int) -> None:
        try:
            frame = sys._getframe(1)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        except ValueError:
            where = "?"
        line = f"{prefix}pair {pair} called os._exit({code}) at {where}\n"
        try:
            os.write(fd, line.encode("utf-8", "replace")[:512])  # one write under PIPE_BUF: never cut
        except OSError:
            pass
        real_exit(code)

    os._exit = _exit  # type: ignore[assignment]


# --------------------------------------------------------------------------- the watchdog's stack


class _StackReporter:
    """Logs the app thread's Python stack once each time the watchdog marks the pair stuck.

    The pair's I/O thread (C++) writes one byte to a pipe when it marks the
    pair stuck; a thread of this interpreter waits on the pipe and formats
    the app thread's current frame (`ServerCore.app_frame()`), which it can
    while the app thread is blocked: a blocking call releases the
    interpreter's GIL, and a Python loop hands it over every switch
    interval. Made and closed on the app thread.
    """

    def __init__(self) -> None:
        self.core: Any = None  # the ServerCore, once made
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.thread = threading.Thread(target=self._run, name="cadeloop-stuck-stack")
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return  # close(): the pair ended
            core = self.core
            frame = core.app_frame() if core is not None else None
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (no Python frame)\n"
            del frame
            logger.warning("stuck: the app thread's Python stack (most recent call last):\n%s", stack.rstrip("\n"))

    def close(self) -> None:
        """Ends the thread. After the I/O thread was joined (it writes to the pipe)."""
        os.close(self.write_fd)
        self.thread.join()
        os.close(self.read_fd)


# --------------------------------------------------------------------------- the server of one pair


class PairServer:
    """Serves one app on one core pair until SIGINT/SIGTERM or `request_stop()`. Made and run on one thread.

    A pair run by a supervisor gets `pair` (its index), `stop_source` (a file
    descriptor its loop watches and a function returning the stop level: 1
    drain, 2 drain cut short), `on_listening` (called with the address once
    it accepts) and `stats_options` (where its counters live). Signal
    handlers are installed only on the main thread of the main interpreter
    (one pair, or a worker process); a pair in a sub-interpreter gets every
    stop request through `stop_source`.
    """

    def __init__(self, app: Any, config: Config) -> None:
        self.app = app
        self.config = config
        self.core: Any = None
        self.stats: dict[str, Any] = {}
        self.pair: int | None = None
        self.stop_source: tuple[int, Callable[[], int]] | None = None
        self.on_listening: Callable[[str], None] | None = None
        # Where the pair's counters live: {"stats_region": r, "stats_index": i} or
        # {"stats_page_address": a, "stats_index": i}; None: run() makes a region of one page.
        self.stats_options: dict[str, Any] | None = None
        self.endpoint: Any = None
        self._stopping = False
        self._stop_requested_at: float | None = None
        self._cut = False  # a second signal (or stop level 2) cut the drain short
        self._drain_delay: asyncio.TimerHandle | None = None  # the drain's start while drain_delay runs
        self._stop_source_closed = False
        self._stopped: asyncio.Future[None] | None = None
        #: The pair served its limit_max_requests and drained to be replaced (its supervisor starts another).
        self.replaced = False
        #: Set by a supervisor that decides when the pair is replaced (worker processes: one at a time,
        #: so a port always has a listener): called at the limit instead of draining at once.
        self.on_max_requests: Callable[[], None] | None = None

    def run(self) -> None:
        apply_log_level(self.config.log_level)
        if current_pair() is None:
            set_current_pair(self.pair if self.pair is not None else 0)
        region = None
        if self.stats_options is None:
            region = _core.StatsRegion(1)
            self.stats_options = {"stats_region": region, "stats_index": 0}
            self.endpoint = start_endpoint(self.config, region, "single pair")
        loop = Loop(spin_us=self.config.spin_us)
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve(loop))
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            if self.endpoint is not None:
                self.endpoint.close()
                self.endpoint = None
            if self.config.access_log:
                _core.flush_access_logs(max(self.config.grace, 1.0))

    def request_stop(self) -> None:
        """Graceful stop: no more accepts, in-flight requests finish within `grace`. Loop thread."""
        if self.core is not None and not self._stopping:
            self._stopping = True
            self._stop_requested_at = time.monotonic()  # grace counts from here, for connections and tasks
            if self.endpoint is not None:
                self.endpoint.set_draining()  # /readyz says 503 before the listener closes
            logger.info("shutting down: finishing requests in flight (grace %gs)", self.config.grace)
            self.core.request_stop()

    def _count_refusal(self) -> None:
        """A 503 of limit_concurrency: counted in the pair's stats page. Loop thread."""
        if self.core is not None:
            self.core.count_concurrency_refusal()

    def _replace(self) -> None:
        """limit_max_requests reached: drain like on SIGTERM, to be replaced by the supervisor. Loop thread."""
        if self._stopping or self.replaced:
            return
        self.replaced = True
        if self.on_max_requests is not None:
            logger.info("served limit_max_requests (%d): to be replaced", self.config.limit_max_requests)
            self.on_max_requests()
            return
        logger.info("served limit_max_requests (%d): draining to be replaced", self.config.limit_max_requests)
        self.request_stop()

    def _on_signal(self, signum: int) -> None:
        if self._stopping and self.core is not None:
            # A second SIGINT or SIGTERM cuts the drain short (docs/operations.md).
            logger.info("%s again: cutting the drain short", signal.Signals(signum).name)
            self._cut_short()
            return
        if self._drain_delay is not None:
            # A second signal during drain_delay: the drain begins now, cut short.
            logger.info("%s again: cutting the drain short", signal.Signals(signum).name)
            self._end_drain_delay()
            self._cut_short()
            return
        delay = self.config.drain_delay
        if delay > 0 and self.stop_source is None and self.core is not None:
            # drain_delay: /readyz says 503 while the listener still accepts and requests are
            # served, so a load balancer's health check takes this instance out first.
            if self.endpoint is not None:
                self.endpoint.set_draining()
            logger.info("%s: /readyz answers 503; serving on for drain_delay %gs, then shutting down",
                        signal.Signals(signum).name, delay)
            self._drain_delay = asyncio.get_running_loop().call_later(delay, self._end_drain_delay)
            return
        self.request_stop()

    def _end_drain_delay(self) -> None:
        """drain_delay is over (or a second signal cut it): the drain begins. Loop thread."""
        if self._drain_delay is not None:
            self._drain_delay.cancel()
            self._drain_delay = None
        self.request_stop()

    def pair_address(self, description: str) -> str:
        """The address a supervised pair names: its socket's, also when the parent handed it over."""
        # "fd 7 (127.0.0.1:8000)": a socket the sub-interpreter pairs' parent bound (cadeloop._host);
        # the user asked for 127.0.0.1:8000, and the log says that, as in every other mode.
        if self.config.fd is not None and description.startswith("fd ") and description.endswith(")"):
            return description[description.index("(") + 1:-1]
        return description

    def _cut_short(self) -> None:
        """Ends the drain now: the app's tasks are cancelled and not waited for. Loop thread."""
        self._cut = True
        if self.core is not None:
            self.core.cancel_tasks()

    def _on_stop_request(self) -> None:
        assert self.stop_source is not None
        level = self.stop_source[1]()
        if level < 0:  # the supervisor is gone (end of its pipe): drain and exit
            asyncio.get_running_loop().remove_reader(self.stop_source[0])
            self._stop_source_closed = True
            level = 1
        if level >= 1 and not self._stopping:
            self.request_stop()
        if level >= 2 and self.core is not None:
            logger.info("drain cut short: cancelling the app's tasks")
            self._cut_short()

    def _on_stopped(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    @staticmethod
    def _on_app_error(message: str, exc: BaseException | None) -> None:
        if isinstance(exc, ClientDisconnected):
            # The client left while the app was sending (send() raised, as ASGI asks): not an
            # app error, and common behind a browser or a load balancer. One debug line.
            logger.debug("client disconnected during the response (%s)", exc)
            return
        if exc is None:
            error_logger.error(message)
        else:
            error_logger.error(message, exc_info=exc)

    def write_stats(self, path: str) -> None:
        """Writes the pair's counters as JSON to `path` (SIGUSR1 and exit, with --stats-json-on-exit). Loop thread."""
        write_json(path, self.core.stats() if self.core is not None else self.stats)

    async def _serve(self, loop: Loop) -> None:
        config = self.config
        _probe_listen(config)
        self._stopped = loop.create_future()
        lifespan = _Lifespan(self.app, config.lifespan, loop)
        await lifespan.startup()
        options = config.core_options()
        options.update(self.stats_options or {})
        limit = config.limit_max_requests
        app = admit(self.app, config.limit_concurrency, max_requests_for_pair(limit) if limit else None,
                    lambda: loop.call_soon(self._replace), self._count_refusal)
        reporter = _StackReporter() if config.stuck_timeout else None
        if reporter is not None:
            options["stuck_notify_fd"] = reporter.write_fd
        try:
            core = _core.ServerCore(app, loop, options, self._on_app_error, self._on_stopped)
            if reporter is not None:
                reporter.core = core
            if lifespan.state is not None:
                core.set_state(lifespan.state)
            error = core.start()
        except BaseException:
            if reporter is not None:
                reporter.close()
            raise
        if error:
            core.close()
            if reporter is not None:
                reporter.close()
            await lifespan.shutdown()
            raise StartupError(error)
        self.core = core
        # Each signal this pair handles, with the handler it had before, put back at the end:
        # asyncio's remove_signal_handler() leaves SIG_DFL, which in a worker process (where
        # the supervisor set SIG_IGN) would let a late SIGTERM, such as the parent-death
        # signal arriving after the control pipe's end began the drain, kill the worker
        # before its lifespan shutdown.
        signals: list[tuple[int, Any]] = []
        # Signals reach only the main thread of the main interpreter; a pair run by the
        # supervisor gets its stop requests through stop_source instead.
        if _core.in_main_interpreter() and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signals.append((sig, signal.getsignal(sig)))
                loop.add_signal_handler(sig, self._on_signal, sig)
            if config.ssl_certfile is not None:  # SIGHUP re-reads the TLS certificate and key
                _core.tls_reload_on_signal(signal.SIGHUP)
            if config.stats_json_on_exit:
                path = config.stats_json_on_exit
                signals.append((signal.SIGUSR1, signal.getsignal(signal.SIGUSR1)))
                loop.add_signal_handler(signal.SIGUSR1, self.write_stats, path)
        if self.stop_source is not None:
            loop.add_reader(self.stop_source[0], self._on_stop_request)
        loop._attach_source(core.source_capsule())
        loop._cadeloop_server_core = core  # loop.stats()["pair"]
        try:
            if self.pair is None:
                # "http://unix:/run/app.sock" for a Unix socket, as uvicorn and curl --unix-socket users read it.
                logger.info("listening on %s://%s (1 core pair, pid %d)",
                            self.config.scheme(), core.description, os.getpid())
            else:
                logger.info("serving on %s (pid %d)", self.pair_address(core.description), os.getpid())
            if self.on_listening is not None:
                self.on_listening(self.pair_address(core.description))
            await self._stopped
            # Every connection is closed now; tasks may still run (background work, an app
            # that ignores disconnects). They get what is left of the grace period (it began
            # with the stop request, not when the connections were done), then are cancelled.
            started = self._stop_requested_at if self._stop_requested_at is not None else time.monotonic()
            deadline = started + max(config.grace, 0.1)
            while core.active_tasks() and time.monotonic() < deadline and not self._cut:
                await asyncio.sleep(0.005)
            if core.active_tasks():
                core.cancel_tasks()
                for _ in range(100):
                    if not core.active_tasks():
                        break
                    await asyncio.sleep(0.01)
        finally:
            loop._detach_source()
            loop._cadeloop_server_core = None
            if self.stop_source is not None and not self._stop_source_closed:
                loop.remove_reader(self.stop_source[0])
            for sig, previous in signals:
                loop.remove_signal_handler(sig)
                if previous is not None:
                    signal.signal(sig, previous)
            if not self._stopping:
                core.request_stop()
            core.join()
            self.stats = core.stats()
            if reporter is not None:
                reporter.close()
                reporter.core = None
            core.close()
            self.core = None
        await lifespan.shutdown()
        s = self.stats
        logger.info(
            "stopped: %d requests, %d responses; wake-ups per request: app %.3f, I/O %.3f",
            s["requests"], s["responses"], s["wakeups_to_app"] / max(s["requests"], 1),
            s["wakeups_to_io"] / max(s["requests"], 1),
        )
        if config.stats_json_on_exit:
            self.write_stats(config.stats_json_on_exit)
