"""The server's counters: the stats endpoint, the shared region it reads, and the totals at exit.

The main process (or main interpreter) creates a `_core.StatsRegion` with one
page per core pair before any pair starts, so forked workers share it and
sub-interpreters reach it by address. Each pair's own threads write its page;
the endpoint (a native thread of the main process) only reads.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

from . import _core
from ._errors import StartupError
from ._log import logger

__all__ = ["start_endpoint", "region_stats", "merge_stats", "write_json"]


def start_endpoint(config: Any, region: Any, isolation: str) -> Any:
    """The running `_core.StatsEndpoint` when `config.stats_port` is set, else None.

    Raises StartupError (one line) when its address is taken. Main thread of
    the main interpreter.
    """
    if config.stats_port is None:
        return None
    info = {
        "isolation": isolation,
        "python_version": platform.python_version(),
        "started_unix_ms": int(time.time() * 1000),
    }
    if getattr(config, "stats_allowed_hosts", None):
        info["allowed_hosts"] = [h.strip() for h in config.stats_allowed_hosts.split(",") if h.strip()]
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


_NOT_ADDITIVE = frozenset({"pid", "index", "state", "started_unix_ms"})


def merge_stats(per_pair: dict[int, list[dict[str, Any]]], isolation: str) -> dict[str, Any]:
    """One JSON-able dict: totals at the top (as with one pair), and `pairs`: each pair's counters.

    A pair that was restarted contributes the sum over its workers.
    """
    pairs = []
    totals: dict[str, Any] = {}
    for index in sorted(per_pair):
        pair: dict[str, Any] = {"pair": index, "starts": len(per_pair[index])}
        for stats in per_pair[index]:
            for key, value in stats.items():
                if key in _NOT_ADDITIVE or key.startswith("latency_p"):
                    continue  # percentiles and identities do not add up; see stats["region"]
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    pair[key] = pair.get(key, 0) + value
        pairs.append(pair)
        for key, value in pair.items():
            if key not in ("pair", "starts"):
                totals[key] = totals.get(key, 0) + value
    totals["cores"] = len(pairs)
    totals["isolation"] = isolation
    totals["pairs"] = pairs
    return totals


def write_json(path: str, data: dict[str, Any]) -> None:
    """Writes `data` to `path` whole or not at all (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
