"""The server's Python log: the `cadeloop` loggers, handed to the native server log.

Every interpreter (the main one, each sub-interpreter pair, each worker
process) has its own `logging` module, so each calls `configure_logging()`
and `apply_log_level()` itself; a pair calls `configure_pair_logging()`,
which also prefixes its lines with "pair N: ".
"""

from __future__ import annotations

import logging
import sys

from . import _core

__all__ = [
    "logger", "error_logger", "ServerLogHandler", "configure_logging", "apply_log_level", "configure_pair_logging",
]

#: Start-up, shutdown and supervisor lines.
logger = logging.getLogger("cadeloop")
#: Exceptions raised by the app (requests, lifespan), with their tracebacks.
error_logger = logging.getLogger("cadeloop.error")


class ServerLogHandler(logging.Handler):
    """Hands each record of the `cadeloop` loggers to the native server log (`_core.log`).

    The text is what logging.Formatter("%(message)s") makes of the record
    (the traceback appended when exc_info is set); the native log adds the
    "cadeloop: " prefix and writes it to stderr with one write, in order with
    the messages written from C++. `prefix` goes before the message ("pair
    N: " in a pair's interpreter or worker).
    """

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.set_prefix(prefix)

    def set_prefix(self, prefix: str) -> None:
        self.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            # What Python still buffers for stderr (a partial line) goes first.
            if sys.stderr is not None:
                sys.stderr.flush()
            _core.log(record.levelno, text)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def configure_logging() -> None:
    """Sends the `cadeloop` and `cadeloop.error` loggers to the native server log, at info.

    Left alone when the embedding program configured logging itself (a
    handler on `cadeloop` or on the root logger): records then go there.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    logger.addHandler(ServerLogHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


def apply_log_level(name: str) -> None:
    """--log-level (debug, info, warning, error) for this interpreter and the process.

    The Python logger's level, so a record below it is never formatted, and
    the native log's (process-wide), which also filters what C++ writes.
    Every interpreter sets its own logger; each pair sets both again.
    """
    logger.setLevel(name.upper())
    _core.set_log_level(name)


def configure_pair_logging(index: int, log_level: str) -> None:
    """Prefixes this interpreter's (or worker's) log lines with its pair and applies --log-level.

    Called before the app is imported, so the pair's first line is filtered
    and prefixed already. A worker process inherits the supervisor's
    handler; a sub-interpreter starts with none and gets its own.
    """
    configure_logging()
    for handler in logger.handlers:
        if isinstance(handler, ServerLogHandler):
            handler.set_prefix(f"pair {index}: ")
    apply_log_level(log_level)
