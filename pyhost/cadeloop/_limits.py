"""Start-up hygiene: the open-file limit raised as far as the process may, and a warning when it is still low.

Each connection is a descriptor. A soft RLIMIT_NOFILE of 1024 (the usual
default) is far below `max_connections` (10,000 per pair by default), and a
server that reaches it stops accepting with EMFILE. The soft limit may be
raised to the hard one without privileges, so the server does that at start;
when even the hard limit is below what the settings allow, one line says so
and names the fix.
"""

from __future__ import annotations

import resource
from typing import Any

from ._log import logger

__all__ = ["FD_HEADROOM", "raise_fd_limit"]

#: Descriptors besides connections: listeners, eventfds, epoll, pipes, logs, the app's own files.
FD_HEADROOM = 64


def raise_fd_limit(config: Any, pairs: int) -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit; warns once when it is below what `config` needs.

    Returns the soft limit now in force. Main thread, before any pair starts
    (worker processes and sub-interpreters share or inherit it).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # e.g. a hard limit above fs.nr_open: keep what we have
    needed = config.max_connections * pairs + FD_HEADROOM * pairs
    if soft != resource.RLIM_INFINITY and soft < needed:
        logger.warning(
            "open files limit is %d, below max_connections %d x %d pair%s + headroom (%d): connections past it "
            "are refused with EMFILE; raise it (ulimit -n, systemd LimitNOFILE=) or lower max_connections",
            soft, config.max_connections, pairs, "" if pairs == 1 else "s", needed)
    return soft
