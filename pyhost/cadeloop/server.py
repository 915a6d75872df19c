"""cadeloop's HTTP server: one core pair serving an ASGI 3.0 app.

The core pair's native I/O thread (listener, HTTP/1.1 connections, limits,
timeouts, pipelining, response writes) runs in C++ and never touches Python.
The app thread is the thread that calls `serve()`: it runs a cadeloop.Loop to
which the pair's inbound ring is attached (`_core.ServerCore`, C++), so
requests are drained, their scopes built and their app coroutines started
eagerly inside the loop's own pass. This module holds what is naturally
Python: settings and their checks, loading the app, the lifespan protocol,
signals and the order of start-up and shutdown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any, Callable

from . import _core
from ._loop import Loop

__all__ = ["Config", "AppLoadError", "StartupError", "ClientDisconnected", "load_app", "serve", "Server"]

logger = logging.getLogger("cadeloop")
error_logger = logging.getLogger("cadeloop.error")

ClientDisconnected = _core.ClientDisconnected


class AppLoadError(Exception):
    """APP names a module or attribute that does not exist (one line for the user)."""


class StartupError(Exception):
    """The server could not start (one line for the user); `exit_code` is what the command exits with."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# name -> (type, lowest, highest, help). Seconds are floats; sizes are bytes.
SETTINGS: dict[str, tuple[type, float, float, str]] = {
    "max_body": (int, 0, 2**63, "largest request body in bytes (413 above)"),
    "max_url": (int, 32, 1 << 20, "longest request target in bytes (414 above)"),
    "max_header_bytes": (int, 32, 1 << 24, "largest request head in bytes (431 above)"),
    "max_headers": (int, 1, 10_000, "most header fields in a request (431 above)"),
    "max_pipelined": (int, 1, 1024, "requests in flight per connection (pipelining)"),
    "body_window": (int, 1024, 1 << 30, "request body bytes handed to the app and not yet read before reading pauses"),
    "send_high_mark": (int, 1024, 1 << 30, "response bytes per connection after which send() waits for the client"),
    "max_connections": (int, 1, 1 << 24, "open connections above which accepting pauses"),
    "max_requests_in_flight": (int, 1, 1 << 24, "requests in flight (all connections) above which accepting pauses"),
    "request_line_timeout": (float, 0.001, 86400, "seconds for a request head to arrive (408 after)"),
    "keepalive_idle": (float, 0.001, 86400, "seconds an idle keep-alive connection is kept"),
    "grace": (float, 0, 86400, "seconds in-flight requests get to finish after SIGTERM/SIGINT"),
    "backlog": (int, 1, 65535, "listen(2) backlog"),
    "io_spin_us": (int, 0, 1_000_000, "microseconds the I/O thread spins before it sleeps"),
    "spin_us": (int, 0, 1_000_000, "microseconds the app loop spins before it sleeps"),
}


@dataclasses.dataclass
class Config:
    """Every server setting. `check()` refuses a bad value with one line naming it."""

    app: Any = None
    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None
    fd: int | None = None
    app_dir: str | None = None
    factory: bool = False
    root_path: str = ""
    lifespan: str = "auto"
    cores: int = 1
    isolation: str = "auto"
    pin: bool = False
    server_header: str = "cadeloop"
    stats_json_on_exit: str | None = None
    max_body: int = 1 << 30
    max_url: int = 8 * 1024
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    max_pipelined: int = 16
    body_window: int = 256 * 1024
    send_high_mark: int = 1024 * 1024
    max_connections: int = 10_000
    max_requests_in_flight: int = 4096
    request_line_timeout: float = 10.0
    keepalive_idle: float = 5.0
    grace: float = 30.0
    backlog: int = 1024
    io_spin_us: int = 0
    spin_us: int = 0

    def check(self) -> None:
        if self.lifespan not in ("auto", "on", "off"):
            raise ValueError(f"lifespan must be 'auto', 'on' or 'off', not {self.lifespan!r}")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], not {self.port!r}")
        if self.uds is not None and self.fd is not None:
            raise ValueError("uds and fd cannot both be given")
        if self.isolation not in ("auto", "subinterpreters", "processes"):
            raise ValueError(f"isolation must be 'auto', 'subinterpreters' or 'processes', not {self.isolation!r}")
        if not isinstance(self.cores, int) or isinstance(self.cores, bool) or not 0 <= self.cores <= 1024:
            raise ValueError(f"cores must be an int in [0, 1024] (0: one pair per usable CPU), not {self.cores!r}")
        if self.cores != 1:
            raise ValueError(
                f"--cores {self.cores}: more than one core pair arrives with the every-core release; "
                "use --cores 1 for now"
            )
        for name, (kind, low, high, _) in SETTINGS.items():
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is int:
                ok = ok and isinstance(value, int)
            if not ok or not low <= value <= high:
                what = "an int" if kind is int else "a number"
                raise ValueError(f"{name} must be {what} in [{low:g}, {high:g}], not {value!r}")

    def core_options(self) -> dict[str, Any]:
        if self.uds is not None:
            listen: dict[str, Any] = {"kind": "unix", "path": self.uds}
        elif self.fd is not None:
            listen = {"kind": "fd", "fd": self.fd}
        else:
            listen = {"kind": "tcp", "host": self.host, "port": self.port}
        opts = {name: getattr(self, name) for name in SETTINGS if name != "spin_us"}
        opts.update(listen)
        opts["root_path"] = self.root_path
        opts["server_header"] = self.server_header
        return opts

    def describe_listen(self) -> str:
        if self.uds is not None:
            return f"unix:{self.uds}"
        if self.fd is not None:
            return f"fd {self.fd}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


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
        elif self.task.exception() is not None:
            error_logger.error("Exception in ASGI lifespan shutdown", exc_info=self.task.exception())
        if not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 1.0)
            except (asyncio.TimeoutError, Exception):
                pass


# --------------------------------------------------------------------------- the server


def _probe_listen(config: Config) -> None:
    """Refuses an address already taken before the app's startup runs (the pair binds for real later)."""
    if config.uds is not None or config.fd is not None or config.port == 0:
        return
    try:
        infos = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {config.describe_listen()}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            reason = reason[:1].lower() + reason[1:]
            raise StartupError(f"cannot listen on {config.describe_listen()}: {reason}") from None


class Server:
    """Serves one app on one core pair until SIGINT/SIGTERM or `request_stop()`. Made and run on one thread."""

    def __init__(self, app: Any, config: Config) -> None:
        self.app = app
        self.config = config
        self.core: Any = None
        self.stats: dict[str, Any] = {}
        self._stopping = False
        self._stopped: asyncio.Future[None] | None = None

    def run(self) -> None:
        loop = Loop(spin_us=self.config.spin_us)
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve(loop))
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def request_stop(self) -> None:
        """Graceful stop: no more accepts, in-flight requests finish within `grace`. Loop thread."""
        if self.core is not None and not self._stopping:
            self._stopping = True
            logger.info("shutting down: finishing requests in flight (grace %gs)", self.config.grace)
            self.core.request_stop()

    def _on_signal(self, signum: int) -> None:
        if self._stopping and self.core is not None:
            logger.info("%s again: cancelling the app's tasks", signal.Signals(signum).name)
            self.core.cancel_tasks()
            return
        self.request_stop()

    def _on_stopped(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    @staticmethod
    def _on_app_error(message: str, exc: BaseException | None) -> None:
        if exc is None:
            error_logger.error(message)
        else:
            error_logger.error(message, exc_info=exc)

    def write_stats(self, path: str) -> None:
        stats = self.core.stats() if self.core is not None else self.stats
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)
        os.replace(tmp, path)

    async def _serve(self, loop: Loop) -> None:
        config = self.config
        _probe_listen(config)
        self._stopped = loop.create_future()
        lifespan = _Lifespan(self.app, config.lifespan, loop)
        await lifespan.startup()
        core = _core.ServerCore(self.app, loop, config.core_options(), self._on_app_error, self._on_stopped)
        if lifespan.state is not None:
            core.set_state(lifespan.state)
        error = core.start()
        if error:
            core.close()
            await lifespan.shutdown()
            raise StartupError(error)
        self.core = core
        signals: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
                signals.append(sig)
            if config.stats_json_on_exit:
                path = config.stats_json_on_exit
                loop.add_signal_handler(signal.SIGUSR1, self.write_stats, path)
                signals.append(signal.SIGUSR1)
        loop._attach_source(core.source_capsule())
        try:
            scheme = "http+unix" if config.uds else "http"
            logger.info("listening on %s://%s (1 core pair, pid %d)", scheme, core.description, os.getpid())
            await self._stopped
            # Every connection is closed now; tasks may still run (background work, an app
            # that ignores disconnects). Give them the grace period, then cancel them.
            deadline = loop.time() + max(config.grace, 0.1)
            while core.active_tasks() and loop.time() < deadline:
                await asyncio.sleep(0.005)
            if core.active_tasks():
                core.cancel_tasks()
                for _ in range(100):
                    if not core.active_tasks():
                        break
                    await asyncio.sleep(0.01)
        finally:
            loop._detach_source()
            for sig in signals:
                loop.remove_signal_handler(sig)
            if not self._stopping:
                core.request_stop()
            core.join()
            self.stats = core.stats()
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


def _configure_logging() -> None:
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cadeloop: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, **settings: Any) -> None:
    """Serve `app` (an ASGI app, or "module:attribute") until SIGINT/SIGTERM.

    Settings are the fields of `Config` (uds, fd, root_path, lifespan, grace,
    max_body, keepalive_idle, ...). Runs the app thread on the calling thread.
    Raises ValueError (bad setting), AppLoadError, or StartupError (address in
    use, failed lifespan startup), each with one line for the user.
    """
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise TypeError(f"serve() got unknown setting(s) {', '.join(unknown)}")
    config = Config(app=app, host=host, port=port, **settings)
    config.check()
    _configure_logging()
    asgi_app = load_app(app, config.app_dir, config.factory)
    Server(asgi_app, config).run()

