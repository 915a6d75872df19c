"""cadeloop's HTTP server: an ASGI 3.0 app served on one core pair or on N.

`serve()` and the command line come here. One pair (`--cores 1`) runs on the
calling thread (`cadeloop._pair.PairServer`); more pairs run in
sub-interpreters or worker processes under a supervisor
(`cadeloop._subinterpreters`, `cadeloop._workers`), each pair again a
`PairServer`. This module is the top of the package's imports: it decides
between the two and re-exports the names users reach through
`cadeloop.server` (the errors, `load_app`, `current_pair`, `Config`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

from . import _core
from ._cpus import pin_sets, resolve_cores
from ._dropin import apply_log_config, load_env_file
from ._errors import AppLoadError, ClientDisconnected, StartupError
from ._host import HostSupervisor, split_pairs
from ._limits import raise_fd_limit
from ._log import apply_log_level, configure_logging, error_logger, logger
from ._pair import PairServer, bind_reuseport, current_pair, load_app
from ._stats import merge_stats, region_stats, write_json
from ._subinterpreters import choose_isolation
from ._supervisor import Supervisor
from ._workers import ProcessSupervisor
from .config import SETTINGS, Config, SettingError, resolve

__all__ = [
    "Config", "AppLoadError", "StartupError", "ClientDisconnected", "load_app", "serve", "Server", "current_pair",
    "run_server", "logger", "error_logger",
]


def check_tls_files(config: Config) -> None:
    """With TLS on, the ssl_* files are read and checked before anything binds: StartupError (exit 2, one line)."""
    if config.ssl_certfile is not None:
        problem = _core.check_tls(config.core_options())
        if problem:
            raise StartupError(problem, 2)


class Server(PairServer):
    """Serves one app until SIGINT/SIGTERM: on this thread with one core pair, else on every pair.

    With `config.cores` 1 this is the `PairServer` of one pair (signals,
    `request_stop()`, the stats endpoint of one page). With other values
    `run()` serves `resolve_cores(cores)` pairs through `run_server()` and
    keeps their merged counters in `stats`. Made and run on one thread, the
    main thread of the main interpreter for more than one pair.
    """

    def run(self) -> None:
        check_tls_files(self.config)
        if self.config.cores == 1 or self.pair is not None:
            if self.pair is None:
                raise_fd_limit(self.config, 1)
            super().run()
            return
        apply_log_level(self.config.log_level)
        self.stats = run_server(self.config, self.app)


def run_server(config: Config, app: Any = None) -> dict[str, Any]:
    """Serves `config.app` on `config.cores` core pairs until SIGINT/SIGTERM; returns the counters.

    `app` is the loaded app when the caller already imported it (the
    worker processes then inherit it), else None: each pair imports
    `config.app` itself. One pair runs on the calling thread; more run in
    sub-interpreters or worker processes (`config.isolation`). Raises
    StartupError (one line) when the server cannot start or a pair failed;
    the caller prints it and exits with its code. Main thread of the main
    interpreter.
    """
    check_tls_files(config)
    n = resolve_cores(config.cores)
    if n == 1:
        raise_fd_limit(config, 1)
        if config.pin:
            os.sched_setaffinity(0, pin_sets(1)[0])  # the I/O thread, started later, inherits it
        one = dataclasses.replace(config, cores=1)
        srv = PairServer(app if app is not None else load_app(config.app, config.app_dir, config.factory), one)
        srv.run()
        return srv.stats
    if config.uds is not None or config.fd is not None:
        raise StartupError(
            f"--cores {config.cores}: more than one core pair needs a TCP address (--host/--port); "
            "--uds and --fd serve one pair", 2)
    raise_fd_limit(config, n)
    isolation, why = choose_isolation(config)
    logger.info("isolation %s (%s)", isolation, why)
    reserved = bind_reuseport(config)
    port = reserved.getsockname()[1]
    supervisor: Supervisor
    if isolation == "processes":
        if app is None:
            app = load_app(config.app, config.app_dir, config.factory)
        supervisor = ProcessSupervisor(config, app, n, port, reserved)
    else:
        # Sub-interpreter pairs run in two serving processes under this one, which keeps the
        # listening sockets and restarts a serving process a pair crashed (cadeloop._host).
        supervisor = HostSupervisor(config, n, port, reserved, split_pairs(n, config.serving_processes))
    supervisor.run()
    if config.access_log:
        _core.flush_access_logs(max(config.grace, 1.0))
    stats = merge_stats(supervisor.stats_by_pair(), isolation)
    stats["restarts"] = supervisor.restarts
    # The shared pages hold every pair's latest counters (a restarted worker starts its page
    # afresh); the histograms merge there, which summing per-worker dicts cannot do.
    stats["region"] = region_stats(supervisor.region, isolation)
    s = stats
    logger.info("stopped: %d core pairs, %d requests, %d responses", n, s.get("requests", 0), s.get("responses", 0))
    if config.stats_json_on_exit:
        write_json(config.stats_json_on_exit, stats)
    if supervisor.left_alive:
        # A sub-interpreter still runs a thread the app started: ending or finalizing would abort
        # (3.12) or skip its finally blocks (3.13). Leave without finalizing.
        message = supervisor.failure[1] if supervisor.failure else "a core pair did not end"
        sys.stderr.flush()
        _core.log(logging.ERROR,
                  f"{message}; {supervisor.left_alive} interpreter(s) left running, exiting without finalizing")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(supervisor.failure[0] if supervisor.failure else 1)
    if supervisor.failure is not None:
        raise StartupError(supervisor.failure[1], supervisor.failure[0])
    return stats


def serve(app: Any, host: str | None = None, port: int | None = None, **settings: Any) -> dict[str, Any]:
    """Serve `app` (an ASGI app, or "module:attribute") until SIGINT/SIGTERM.

    Settings are the fields of `Config` (uds, fd, root_path, lifespan,
    cores=1, grace="30s", max_body="1GiB", keepalive_idle="5s", ...: the
    defaults shown are the table's; see docs/configuration.md for all).
    `host` and `port` default to the table's ("127.0.0.1", 8000). Arguments
    override the CADELOOP_* environment variables, which override the TOML
    file CADELOOP_CONFIG names. Runs the app thread on the calling thread.
    Returns the counters at exit (with more than one pair: totals, `pairs`
    and `region`, every pair's shared stats page). Raises TypeError (unknown
    setting), SettingError (a ValueError: a bad
    value), AppLoadError, or StartupError (address in use, failed lifespan
    startup), each with one line for the user.
    """
    for name in settings:
        if name not in SETTINGS:
            try:
                _core.check_setting(name, None)
            except SettingError as exc:
                raise TypeError(str(exc)) from None
    arguments = dict(settings, app=app)
    if host is not None:
        arguments["host"] = host
    if port is not None:
        arguments["port"] = port
    config = resolve(environ=os.environ, arguments=arguments).config
    if config.env_file:  # its CADELOOP_* variables count too: read the settings again
        load_env_file(config.env_file)
        config = resolve(environ=os.environ, arguments=arguments).config
    if config.reload:
        raise StartupError("reload: the command line's --reload runs the server in a child process it "
                           "restarts; serve() serves in this process and cannot", 2)
    if config.log_config:
        apply_log_config(config.log_config)
    configure_logging()
    asgi_app = load_app(config.app, config.app_dir, config.factory)
    server = Server(asgi_app, config)
    server.run()
    return server.stats
