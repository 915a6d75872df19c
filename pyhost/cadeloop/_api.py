"""The programmatic API shaped like uvicorn's: `cadeloop.Config(app, **settings)`, `cadeloop.Server(config)`.

    config = cadeloop.Config("main:app", port=8080, cores=2)   # or Config(app_object, ...)
    cadeloop.Server(config).run()                               # blocks until SIGINT/SIGTERM

    server = cadeloop.Server(cadeloop.Config(app, port=0))
    task = asyncio.create_task(server.serve())                  # one core pair on a thread of its own
    ...
    server.should_exit = True                                   # graceful stop, as uvicorn's
    await task

`cadeloop.serve(app, **settings)` is uvicorn.run's equivalent; `cadeloop.run(coro)`
stays asyncio.run's (the event loop), so the two never have to be told apart
by the type of their argument.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ._dropin import apply_log_config, load_env_file
from ._errors import StartupError
from ._log import configure_logging
from .config import Config
from .server import Server as _AppServer
from .server import load_app


def prepare(config: Config) -> Any:
    """What precedes serving: the env file, the log configuration, logging, the app loaded. Returns the app."""
    if config.env_file:
        load_env_file(config.env_file)
    if config.log_config:
        apply_log_config(config.log_config)
    configure_logging()
    return load_app(config.app, config.app_dir, config.factory)


class Server:
    """uvicorn.Server's shape over cadeloop's server: `run()`, `await serve()`, `should_exit`.

    `config` is a `cadeloop.Config`. `run()` serves on the calling thread
    (the main thread for more than one core pair) until SIGINT/SIGTERM or
    `should_exit`. `serve()` runs one core pair on a thread of its own and
    returns when it has stopped; set `should_exit = True` (or cancel the
    awaiting task) for a graceful stop. `started` turns true once it
    accepts (one core pair); `stats` holds the counters at exit.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.stats: dict[str, Any] = {}
        self.started = False
        #: The TCP port it listens on once `started` (useful with port=0), else None.
        self.port: int | None = None
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._should_exit = False

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = bool(value)
        if value and self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.request_stop)

    def _on_listening(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        if host and port.isdigit():
            self.port = int(port)
        self._loop = asyncio.get_running_loop()
        self.started = True
        if self._should_exit:
            self._server.request_stop()

    def run(self) -> None:
        """Serves until SIGINT/SIGTERM or `should_exit`. Raises StartupError, AppLoadError, SettingError."""
        app = prepare(self.config)
        self._server = _AppServer(app, self.config)
        if self.config.cores == 1:
            self._server.on_listening = self._on_listening
        try:
            self._server.run()
        finally:
            self.stats = self._server.stats

    async def serve(self) -> None:
        """Serves one core pair on a thread of its own until `should_exit` (or cancellation)."""
        if self.config.cores != 1:
            raise StartupError(f"cores {self.config.cores}: await serve() runs one core pair; use run() "
                               "on the main thread for more", 2)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()
        failure: list[BaseException] = []

        def target() -> None:
            try:
                self.run()
            except BaseException as exc:  # handed to the awaiting task
                failure.append(exc)
            finally:
                caller.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        thread = threading.Thread(target=target, name="cadeloop-serve", daemon=True)
        thread.start()
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            self.should_exit = True
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
            raise
        thread.join()
        if failure:
            raise failure[0]

