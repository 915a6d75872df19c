"""What the conformance runner skips, each with its one-line reason.

Keys are fnmatch patterns over "<Class>.<test_method>" within a module.
"""

from __future__ import annotations

# The test_asyncio modules that exercise an event loop (the Windows-only
# modules are left out: cadeloop is Linux-only). test_proactor_events runs
# for its portable part (the proactor transports over a mock proactor), which
# also creates event loops through asyncio's policy.
DEFAULT_MODULES = [
    "test_base_events",
    "test_buffered_proto",
    "test_context",
    "test_events",
    "test_futures",
    "test_futures2",
    "test_locks",
    "test_pep492",
    "test_proactor_events",
    "test_protocols",
    "test_queues",
    "test_runners",
    "test_selector_events",
    "test_sendfile",
    "test_server",
    "test_sock_lowlevel",
    "test_ssl",
    "test_sslproto",
    "test_staggered",
    "test_streams",
    "test_subprocess",
    "test_taskgroups",
    "test_tasks",
    "test_threads",
    "test_timeouts",
    "test_transports",
    "test_unix_events",
    "test_waitfor",
]

# module -> {pattern: reason}; every Python version.
SKIPS: dict[str, dict[str, str]] = {
    "test_events": {
        "SelectEventLoopTests.*": "the same suite as EPollEventLoopTests once create_event_loop() gives a cadeloop.Loop",
        "PollEventLoopTests.*": "the same suite as EPollEventLoopTests once create_event_loop() gives a cadeloop.Loop",
        "EPollEventLoopTests.test_internal_fds": "cadeloop makes the self-pipe only for signal handlers (wake-ups use the C++ parker's eventfd), so an idle loop has 0 internal fds, not 1",
    },
    "test_sock_lowlevel": {
        "SelectEventLoopTests.*": "the same suite as EPollEventLoopTests once create_event_loop() gives a cadeloop.Loop",
        "PollEventLoopTests.*": "the same suite as EPollEventLoopTests once create_event_loop() gives a cadeloop.Loop",
    },
}

# (major, minor) -> module -> {pattern: reason}
VERSION_SKIPS: dict[tuple[int, int], dict[str, dict[str, str]]] = {}


def skipped_ids(module: str, version: tuple[int, int]) -> dict[str, str]:
    """The patterns to skip in `module` on Python `version`, with reasons."""
    out = dict(SKIPS.get(module, {}))
    out.update(VERSION_SKIPS.get(tuple(version), {}).get(module, {}))
    return out
