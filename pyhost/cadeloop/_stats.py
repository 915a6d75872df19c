"""The stats endpoint and the per-pair counters it reads (one shared-memory region per server).

The main process (or main interpreter) creates a `_core.StatsRegion` with one
page per core pair before any pair starts, so forked workers share it and
sub-interpreters reach it by address. Each pair's own threads write its page;
the endpoint (a native thread of the main process) only reads.
"""

from __future__ import annotations

import logging
import platform
import time
from typing import Any

from . import _core

logger = logging.getLogger("cadeloop")


def start_endpoint(config: Any, region: Any, isolation: str) -> Any:
    """The running `_core.StatsEndpoint` when `config.stats_port` is set, else None.

    Raises StartupError (one line) when its address is taken. Main thread of
    the main interpreter.
    """
    if config.stats_port is None:
        return None
    from .server import StartupError

    info = {
        "isolation": isolation,
        "python_version": platform.python_version(),
        "started_unix_ms": int(time.time() * 1000),
    }
    try:
        endpoint = _core.StatsEndpoint(region, config.stats_host, config.stats_port, info)
    except ValueError as exc:
        raise StartupError(str(exc), 1) from None
    logger.info("stats endpoint on http://%s/ (/stats, /metrics, /healthz, /readyz)", endpoint.address)
    return endpoint


def region_stats(region: Any, isolation: str) -> dict[str, Any]:
    """Totals at the top level and `pairs`: each pair's counters, read from the region."""
    stats = dict(region.totals())
    stats["pairs"] = list(region.snapshot_all())
    stats["cores"] = len(stats["pairs"])
    stats["isolation"] = isolation
    stats["python_version"] = platform.python_version()
    return stats
