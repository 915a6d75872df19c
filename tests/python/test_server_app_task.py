"""What an app and its libraries see of "the task running my request", against a real `cadeloop` process.

The ASGI bridge runs each request's app coroutine in a task (today an asyncio.Task, started eagerly on 3.12+).
Whatever runs it, an app must see an asyncio task: `asyncio.current_task()` the same object across awaits,
listed by `all_tasks()`, cancellable and uncancellable, with done callbacks; timeouts, task groups, anyio,
contextvars and Starlette/FastAPI working on top of it; app errors and cancellations answered with a 500 (or a
cut connection) while the server goes on; a graceful stop cancelling what outlives the drain. Each route of
server_apps/app_task_app.py answers what it observed, and these tests assert it from real clients.

Servers: one pair (`--cores 1`: the app on the main interpreter, the module's state shared by every request),
and two pairs (own-GIL sub-interpreters on 3.13, worker processes on 3.11) for what one connection observes.
"""

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from websockets.sync.client import connect

from server_harness import ServerProcess, raw_exchange, read_response

APP = "app_task_app:app"
# Two pairs: own-GIL sub-interpreters on 3.13, worker processes on 3.11 (a connection stays on its pair).
SECOND_MODE = "subinterpreters" if sys.version_info >= (3, 13) else "processes"
TWO_PAIRS = ("--cores", "2", "--isolation", SECOND_MODE)
# The same one-pair server with `--asyncio-tasks`: each request in an asyncio.Task instead of cadeloop's native
# request task; what an app sees must not differ but for the task's type.
ASYNCIO_TASKS = "one pair, asyncio tasks"
EVERY_MODE = ["one pair", SECOND_MODE, ASYNCIO_TASKS]


def stop_cleanly(srv: ServerProcess) -> None:
    rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()


@pytest.fixture(scope="module")
def one_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(APP, "--cores", "1", tmp=tmp_path_factory.mktemp("app-task")).start()
    yield srv
    stop_cleanly(srv)


@pytest.fixture(scope="module")
def two_pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(APP, *TWO_PAIRS, tmp=tmp_path_factory.mktemp("app-task-two")).start()
    yield srv
    stop_cleanly(srv)


@pytest.fixture(scope="module")
def one_pair_asyncio_tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(APP, "--cores", "1", "--asyncio-tasks", tmp=tmp_path_factory.mktemp("app-task-asyncio")).start()
    yield srv
    stop_cleanly(srv)


@pytest.fixture(params=EVERY_MODE)
def server(request: pytest.FixtureRequest) -> ServerProcess:
    """Each server mode in turn (for what a single connection can observe)."""
    name = {"one pair": "one_pair", ASYNCIO_TASKS: "one_pair_asyncio_tasks"}.get(request.param, "two_pairs")
    srv: ServerProcess = request.getfixturevalue(name)
    return srv


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    # One connection: on two pairs, later requests reach the same pair (and its module state).
    with httpx.Client(base_url=server.url, timeout=10, limits=httpx.Limits(max_connections=1)) as c:
        yield c


def get_json(c: httpx.Client, path: str, status: int = 200) -> Any:
    r = c.get(path)
    assert r.status_code == status, (path, r.status_code, r.text)
    return r.json()


def poll_record(c: httpx.Client, key: str, want: str, timeout: float = 5.0) -> dict[str, Any]:
    """`/record?key=KEY` once it holds `want` (the record a finally or a callback writes after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        rec: dict[str, Any] = get_json(c, f"/record?key={key}")
        if want in rec or time.monotonic() > deadline:
            return rec
        time.sleep(0.01)


def assert_serving(srv: ServerProcess) -> None:
    assert httpx.get(srv.url + "/hello", timeout=10).json() == "hello"


# ------------------------------------------------------------ the task itself

TASK_FACTS = {"isfuture": True, "done": False, "same_loop": True, "name_is_str": True, "coro_is_coroutine": True,
              "repr_ok": True, "cancelling": 0, "in_all_tasks": True, "current_task_of_loop": True,
              "ensure_future_is_task": True, "cancelled": False, "result_not_ready": True,
              "exception_not_ready": True, "coro_is_the_apps": True, "stack_has_frames": True}


def test_current_task_is_one_asyncio_task_across_awaits(client: httpx.Client, server: ServerProcess) -> None:
    got = get_json(client, "/identity")
    # cadeloop's native request task by default; an asyncio.Task with --asyncio-tasks.
    kind = "asyncio.Task" if "--asyncio-tasks" in server.argv else "cadeloop._core.RequestTask"
    assert got == {"current_task": True, "start": TASK_FACTS, "after_sleep0_same": True, "after_sleep_same": True,
                   "received": "http.request", "after_receive_same": True, "end": TASK_FACTS,
                   "set_name": "renamed by the app", "kind": kind}


def test_two_concurrent_requests_have_two_tasks(one_pair: ServerProcess) -> None:
    results: list[Any] = [None, None]

    def one(i: int) -> None:
        with httpx.Client(base_url=one_pair.url, timeout=15) as c:
            results[i] = get_json(c, "/identity?meet=concurrent-identity")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for got in results:
        assert got["distinct_from_partner"] is True and got["partner_is_task"] is True, results
        assert got["start"] == TASK_FACTS and got["after_receive_same"] is True, results


# ------------------------------------------------------------ timeouts, task groups, cancellation


def test_timeouts_expire_inside_the_handler_and_leave_no_cancellation(client: httpx.Client) -> None:
    assert get_json(client, "/timeouts") == {
        "timeout": "TimeoutError", "cancelling_after_timeout": 0,
        "wait_for": "TimeoutError", "cancelling_after_wait_for": 0,
        "nested_inner": "TimeoutError", "nested_outer_body_done": True, "cancelling_after_nested": 0,
        "wait_for_result": "slept", "cancelling_end": 0}


def test_task_groups_cancel_the_request_task_and_uncancel_it(client: httpx.Client) -> None:
    assert get_json(client, "/taskgroup") == {
        "children": [10, 20], "cancelling_after_ok_group": 0,
        # a child failed: the group cancelled the request's task in its body, then uncancelled it
        "cancelling_in_body": 1, "body_cut": True, "prompt": True,
        "caught": ["ValueError: child failed"], "cancelling_after_failed_group": 0}


def test_a_handler_cancels_itself_catches_it_and_uncancels(client: httpx.Client) -> None:
    assert get_json(client, "/self-cancel") == {
        "cancel_returned": True, "cancelling_requested": 1, "raised": "CancelledError", "cancelling_caught": 1,
        "uncancel_returned": 0, "cancelling_after_uncancel": 0, "done": False}


def test_a_cancellation_that_leaves_the_app_is_a_500(server: ServerProcess, client: httpx.Client) -> None:
    r = client.get("/self-cancel-uncaught")
    assert (r.status_code, r.text) == (500, "Internal Server Error\n")
    server.wait_log(r"Exception in ASGI application\n(?:.*\n)*?.*in self_cancel\n(?:.*\n)*?"
                    r"asyncio\.exceptions\.CancelledError")
    assert_serving(server)


def test_a_cancellation_after_the_response_started_cuts_the_connection(server: ServerProcess) -> None:
    out = raw_exchange(server.port, b"GET /self-cancel-uncaught?started=1 HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
    assert out.startswith(b"HTTP/1.1 200 ") and b"partial" in out, out
    assert not out.endswith(b"0\r\n\r\n"), out  # the chunked body never ends: the client sees a cut
    assert_serving(server)


def test_another_task_cancels_the_request_task_and_its_finally_runs(server: ServerProcess,
                                                                     client: httpx.Client) -> None:
    key = f"victim-{time.monotonic_ns()}"
    r = client.get(f"/victim?key={key}")
    assert (r.status_code, r.text) == (500, "Internal Server Error\n")
    server.wait_log(f"app_task_app: victim {key} finally ran after CancelledError")
    assert_serving(server)


def test_a_request_task_cancelled_while_it_waits_for_its_body(server: ServerProcess) -> None:
    key = f"victim-body-{time.monotonic_ns()}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        # 10 bytes announced, 3 sent: receive() waits for the rest when the other task cancels
        s.sendall(f"POST /victim?key={key}&receive=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc".encode())
        status, _, body = read_response(s.makefile("rb"))
    assert (status, body) == (500, b"Internal Server Error\n")
    server.wait_log(f"app_task_app: victim {key} finally ran after CancelledError")
    assert_serving(server)


def test_the_finally_of_a_cancelled_request_task_is_seen_by_the_next_request(one_pair: ServerProcess) -> None:
    with httpx.Client(base_url=one_pair.url, timeout=10) as c:
        r = c.get("/victim?key=victim1")
        assert (r.status_code, r.text) == (500, "Internal Server Error\n")
        rec = poll_record(c, "victim1", "victim1")
    assert rec == {"victim1:cancel_returned": True,
                   "victim1": {"finally": True, "seen": "CancelledError", "cancelling": 1}}


@pytest.mark.parametrize("eager", ["", "&eager=1"], ids=["suspends", "never-suspends"])
def test_done_callbacks_run_after_the_handler_returns(client: httpx.Client, eager: str) -> None:
    key = f"cb-{time.monotonic_ns()}"
    assert get_json(client, f"/done-callback?key={key}{eager}") == {"removed": 2, "removed_again": 0,
                                                                    "ran_yet": False}
    rec = poll_record(client, key, key)
    assert rec == {key: {"ran": True, "fut_is_task": True, "done": True, "cancelled": False,
                         "handler_had_returned": True, "result": "'returned by the app'"}}
    # never f"{key}:extra" (removed)


# ------------------------------------------------------------ contextvars


def test_contextvars_belong_to_one_request(client: httpx.Client) -> None:
    for v in ("first", "second", "third"):  # one connection: each request after the other
        assert get_json(client, f"/contextvars?v={v}") == {
            "at_start": None, "after_await": v, "child_saw": v, "after_child": v}


def test_contextvars_of_concurrent_requests_do_not_mix(one_pair: ServerProcess) -> None:
    results: dict[str, Any] = {}

    def one(v: str) -> None:
        with httpx.Client(base_url=one_pair.url, timeout=15) as c:
            results[v] = get_json(c, f"/contextvars?v={v}&meet=ctx-concurrent")

    threads = [threading.Thread(target=one, args=(v,)) for v in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for v in ("left", "right"):
        assert results[v] == {"at_start": None, "after_await": v, "child_saw": v, "after_child": v,
                              "after_meeting": v}, results


def test_gather_wait_and_shield_under_a_timeout(client: httpx.Client) -> None:
    assert get_json(client, "/combinators") == {
        "gather": [1, 2, 3], "wait_first": [4], "shield_timeout": "TimeoutError",
        "shielded_child_cancelled": False, "shielded_child_result": 6, "cancelling_end": 0}


def test_a_websocket_session_runs_in_one_task(server: ServerProcess) -> None:
    with connect(f"ws://127.0.0.1:{server.port}/ws", open_timeout=10) as ws:
        for text in ("one", "two", "three"):
            ws.send(text)
            got = json.loads(ws.recv(timeout=10))
            assert got == {"text": text, "same_task": True, "facts": TASK_FACTS}, got
    assert_serving(server)


# ------------------------------------------------------------ what a coroutine may yield


def test_bare_yields_resume_and_a_foreign_future_is_a_runtime_error(client: httpx.Client) -> None:
    assert get_json(client, "/yields") == {
        "bare_yield_resumed": True, "same_task_after_bare_yield": True, "foreign_future": "RuntimeError",
        "bad_yield": "RuntimeError", "runs_on": True}


# ------------------------------------------------------------ app errors


@pytest.mark.parametrize("suspend", ["", "?suspend=1"], ids=["in-the-first-step", "after-a-suspension"])
def test_an_error_before_the_response_is_a_500_and_the_server_goes_on(server: ServerProcess,
                                                                      client: httpx.Client, suspend: str) -> None:
    r = client.get("/raise-before" + suspend)
    assert (r.status_code, r.text) == (500, "Internal Server Error\n")
    assert r.headers["content-length"] == str(len(r.content))
    server.wait_log(r"Exception in ASGI application\nTraceback \(most recent call last\):\n(?:.*\n)*?"
                    r"ValueError: app task boom before the response")
    assert_serving(server)


def test_an_error_after_the_response_started_cuts_the_connection(server: ServerProcess) -> None:
    out = raw_exchange(server.port, b"GET /raise-after HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
    assert out.startswith(b"HTTP/1.1 200 ") and b"partial" in out, out
    assert not out.endswith(b"0\r\n\r\n"), out  # the chunked body never ends: the client sees a cut
    server.wait_log(r"Exception in ASGI application\nTraceback \(most recent call last\):\n(?:.*\n)*?"
                    r"ValueError: app task boom after the response started")
    assert_serving(server)


# ------------------------------------------------------------ libraries


def test_anyio_cancel_scopes_task_groups_and_threads(client: httpx.Client) -> None:
    assert get_json(client, "/anyio") == {
        "move_on_after_cancelled_caught": True, "fail_after": "TimeoutError", "task_group_child": [7],
        "to_thread_other_thread": True, "anyio_task_name_is_str": True, "anyio_task_id_is_current": True,
        "cancelling_end": 0}


def check_framework_request(c: httpx.Client, i: int, tags: list[str]) -> None:
    kind = i % 3
    if kind == 0:
        r = c.get("/fw/async", params={"n": i})
        assert r.json() == {"n": i, "task": True}
    elif kind == 1:
        r = c.get("/fw/sync", params={"n": i})
        assert r.json() == {"n": i, "in_worker_thread": True}
    else:
        tag = f"bg-{threading.get_ident()}-{i}"
        r = c.get("/fw/bg", params={"tag": tag})
        assert r.json() == {"queued": tag}
        tags.append(tag)
    assert r.status_code == 200 and r.headers["x-mw"] == "stamped", (i, r.status_code, r.text)


def test_fastapi_sync_endpoints_background_tasks_and_middleware(one_pair: ServerProcess) -> None:
    tags: list[str] = []
    # 50 in a row on one keep-alive connection
    with httpx.Client(base_url=one_pair.url, timeout=15, limits=httpx.Limits(max_connections=1)) as c:
        for i in range(50):
            check_framework_request(c, i, tags)
    # 8 connections at once
    errors: list[BaseException] = []

    def connection() -> None:
        try:
            with httpx.Client(base_url=one_pair.url, timeout=15) as c:
                for i in range(12):
                    check_framework_request(c, i, tags)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=connection) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(tags) == 16 + 8 * 4
    deadline = time.monotonic() + 10
    while not set(tags) <= set(done := httpx.get(one_pair.url + "/fw/done", timeout=10).json()):
        assert time.monotonic() < deadline, sorted(set(tags) - set(done))
        time.sleep(0.02)


# ------------------------------------------------------------ fairness


def test_a_handler_yielding_in_a_loop_lets_another_connection_be_served(one_pair: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", one_pair.port), timeout=30) as spinner:
        spinner.sendall(b"GET /spin?key=fair1 HTTP/1.1\r\nHost: x\r\n\r\n")
        with httpx.Client(base_url=one_pair.url, timeout=15) as c:
            assert get_json(c, "/poke?key=fair1") == {"spinner_was_running": True}
        status, _, body = read_response(spinner.makefile("rb"))
    assert status == 200
    got = json.loads(body)
    assert got["poked_meanwhile"] is True and got["iterations"] >= 1000, got


# ------------------------------------------------------------ graceful stop


@pytest.mark.parametrize("mode", EVERY_MODE)
def test_a_graceful_stop_cancels_the_task_past_the_drain(tmp_path: Path, mode: str) -> None:
    flags = ("--cores", "1") if mode == "one pair" else TWO_PAIRS
    srv = ServerProcess(APP, *flags, "--grace", "0.5", tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
            srv.wait_log("app_task_app: hang started")
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(20) == 0, srv.log()
            s.settimeout(5)
            assert s.recv(65536) == b""  # closed, never answered
    finally:
        rc = srv.stop()
    assert rc == 0
    log = srv.log()
    assert "app_task_app: hang cancelled\napp_task_app: hang finally ran\n" in log, log
    assert "not cancelled" not in log


def test_a_hung_task_gets_the_grace_period_once(tmp_path: Path) -> None:
    """`grace` is the time in-flight work gets after SIGTERM, counted once: the connections' drain and the tasks'
    wait share it (the tasks' wait used to start a second full grace period when the drain ended)."""
    grace = 3.0
    srv = ServerProcess(APP, "--cores", "1", "--grace", str(grace), tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
            srv.wait_log("app_task_app: hang started")
            assert srv.proc is not None
            signalled = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(20) == 0, srv.log()
            took = time.monotonic() - signalled
    finally:
        srv.stop()
    assert "app_task_app: hang cancelled" in srv.log()
    # Cancelled when the grace period ran out, not before and not a second grace period later.
    assert grace - 0.1 <= took < grace + 1.5, took
