"""The peer suites: other libraries' own test suites, run on asyncio and on cadeloop.

Each entry pins one source distribution on PyPI (version and sha256); the
runner (run_peer_suites.py) downloads it with pip into build/peer/, unpacks
it there and runs the suite's tests against the same version of the library
installed from tests/requirements.txt. Nothing of the suites is committed.

`pytest_args` pick the tests: what the suite's own CI would run minus what
says nothing about an event loop (and costs minutes), each left out with its
reason in `left_out`. `ini` replaces the suite's own pytest configuration
(the options its tests rely on, without its coverage and xdist settings).

KNOWN_DIFFERENCES names each test that passes on asyncio and fails on
cadeloop, with the reason; it is empty while there is none.
"""

from __future__ import annotations

from typing import Any

SUITES: dict[str, dict[str, Any]] = {
    "anyio": {
        "version": "4.16.0",
        "sha256": "59bb03251907983d1603d27c3087ddb1e93299ea2163adcdba37899a4fb12ffb",
        # anyio's asyncio backend: the "asyncio" and (3.12+) "asyncio+eager"
        # parametrizations of its anyio_backend fixture; trio is not
        # installed and uvloop is the other loop, so both are deselected.
        "pytest_args": [
            "-p", "anyio",
            "-p", "pytest_mock",
            "-p", "no:asyncio",
            "-p", "no:trio",
            "-m", "not network",
            "-k", "not trio and not uvloop and not winloop and not TestUDPSocketBackpressure",
            "--ignore", "tests/test_pytest_plugin.py",
            "tests",
        ],
        "left_out": {
            "tests/test_pytest_plugin.py": "anyio's pytest plugin tested through pytester: nested pytest "
            "sessions, about 4.5 minutes, on asyncio's default loop whatever the outer loop is",
            "TestUDPSocketBackpressure": "fails on asyncio here (seen on 3.13.0): its datagrams never fill "
            "the socket's send buffer on this kernel, so each test waits out its 5 s deadline; 40 s a run",
        },
        "ini": """\
[pytest]
anyio_mode = auto
xfail_strict = true
filterwarnings =
    error
    ignore:Module globals; __loader__ != __spec__.loader:DeprecationWarning:
markers =
    network: marks tests as requiring Internet access
""",
    },
    "aiohttp": {
        "version": "3.14.5",
        "sha256": "5558a7f5a05af9ecf744af91e5baefc436f93c9333e656c27ec253f9a6bbe178",
        # aiohttp's client/server tests: real servers and clients over
        # loopback (HTTP, WebSocket, sendfile). Its pytest plugin's "pyloop"
        # is asyncio.new_event_loop, so the policy decides the loop.
        "pytest_args": [
            "-p", "pytest_mock",
            "-m", "not dev_mode and not autobahn and not internal",
            "tests/test_client_functional.py",
            "tests/test_web_functional.py",
            "tests/test_client_ws_functional.py",
            "tests/test_web_websocket_functional.py",
            "tests/test_web_sendfile_functional.py",
        ],
        "left_out": {
            "the other test modules": "aiohttp's parsers, helpers, cookie jar, multipart and so on, "
            "tested with mock loops or none (thousands of tests, minutes) say nothing about a loop; "
            "the benchmarks and the autobahn suite need codspeed and docker",
        },
        "ini": """\
[pytest]
xfail_strict = true
empty_parameter_set_mark = xfail
filterwarnings =
    error
    ignore:Unclosed client session <aiohttp.client.ClientSession object at 0x:ResourceWarning
    ignore:coroutine method 'aclose' of 'BodyPartReader._decode_content_async' was never awaited:RuntimeWarning
    ignore:aiohttp.pytest_plugin will be removed in v4:DeprecationWarning
markers =
    autobahn: Autobahn testsuite. Should be run as a separate job.
    dev_mode: mark test to run in dev mode.
    internal: tests which may cause issues for packagers, but should be run in aiohttp's CI.
    skip_blockbuster: mark test to skip the blockbuster fixture.
""",
    },
}

# suite -> {test node id: why it passes on asyncio and fails on cadeloop}
KNOWN_DIFFERENCES: dict[str, dict[str, str]] = {
    "anyio": {},
    "aiohttp": {},
}
