"""What an app and its libraries see of the task that runs its request (tests/python/test_server_app_task.py).

Every route does something with `asyncio.current_task()` (or with what uses it: timeouts, task groups,
cancellation, done callbacks, contextvars, anyio, Starlette/FastAPI) and answers what it observed as JSON, so
that the test asserts it from a real client. Routes that must be observed after they end (a `finally`, a
done callback, a background task) write into RECORD, which `/record?key=K` reads in a later request. Routes
that need a partner request (two concurrent requests, a request served while another spins) meet through
module state: the server runs one pair (one loop), so every request sees the same module.
"""

import asyncio
import contextvars
import json
import sys
import threading
import time
import types
from typing import Any, Callable
from urllib.parse import parse_qs

import anyio

from app_lifespan import serve_lifespan

RECORD: dict[str, Any] = {}  # key -> what a finally / done callback / background task saw
MEETING: dict[str, list[Any]] = {}  # key -> what each request of a pair brought
KEEP: set[asyncio.Task[Any]] = set()  # background tasks the app created (kept from the GC)
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("app_task_var")


async def answer(send: Callable[[dict[str, Any]], Any], doc: Any, status: int = 200) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def meet(key: str, item: Any, count: int = 2, timeout: float = 10.0) -> list[Any]:
    """Adds `item` under `key` and waits (yielding to the loop) until `count` requests have brought theirs."""
    items = MEETING.setdefault(key, [])
    items.append(item)
    deadline = time.monotonic() + timeout
    while len(items) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    return items


def task_facts(t: asyncio.Task[Any] | None) -> dict[str, Any]:
    """What an app may rely on of the task running its request."""
    assert t is not None
    return {
        "isfuture": asyncio.isfuture(t),
        "done": t.done(),
        "same_loop": t.get_loop() is asyncio.get_running_loop(),
        "name_is_str": isinstance(t.get_name(), str),
        "coro_is_coroutine": asyncio.iscoroutine(t.get_coro()),
        "repr_ok": isinstance(repr(t), str) and len(repr(t)) > 0,
        "cancelling": t.cancelling(),
        "in_all_tasks": t in asyncio.all_tasks(),
        "current_task_of_loop": asyncio.current_task(asyncio.get_running_loop()) is t,
        "ensure_future_is_task": asyncio.ensure_future(t) is t,
        "cancelled": t.cancelled(),
        "result_not_ready": raises(t.result, asyncio.InvalidStateError),
        "exception_not_ready": raises(t.exception, asyncio.InvalidStateError),
        "coro_is_the_apps": getattr(t.get_coro(), "__name__", None) == "app",
        "stack_has_frames": len(t.get_stack()) >= 1,
    }


def raises(f: Callable[[], Any], exc: type[BaseException]) -> bool:
    try:
        f()
    except exc:
        return True
    return False


@types.coroutine
def bare_yield():  # type: ignore[no-untyped-def]
    """Yields None once: the task must simply run it again on the next pass."""
    yield


@types.coroutine
def bad_yield():  # type: ignore[no-untyped-def]
    """Yields something that is no Future: asyncio's task throws a RuntimeError into the coroutine."""
    yield 42


# ------------------------------------------------------------------ routes


async def identity(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any], q: dict[str, str]) -> None:
    t = asyncio.current_task()
    if t is None:
        return await answer(send, {"current_task": None})
    out: dict[str, Any] = {"current_task": True, "start": task_facts(t)}
    await asyncio.sleep(0)
    out["after_sleep0_same"] = asyncio.current_task() is t
    await asyncio.sleep(0.001)
    out["after_sleep_same"] = asyncio.current_task() is t
    message = await receive()
    out["received"] = message["type"]
    out["after_receive_same"] = asyncio.current_task() is t
    out["end"] = task_facts(t)
    t.set_name("renamed by the app")
    out["set_name"] = t.get_name()
    out["kind"] = "asyncio.Task" if isinstance(t, asyncio.Task) else f"{type(t).__module__}.{type(t).__qualname__}"
    if "meet" in q:
        others = await meet(q["meet"], t)
        out["distinct_from_partner"] = len(others) == 2 and others[0] is not others[1]
        out["partner_is_task"] = all(asyncio.isfuture(o) for o in others)
    await answer(send, out)


async def timeouts(send: Callable[[Any], Any]) -> None:
    t = asyncio.current_task()
    assert t is not None
    out: dict[str, Any] = {}
    try:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
        out["timeout"] = "not raised"
    except TimeoutError:
        out["timeout"] = "TimeoutError"
    out["cancelling_after_timeout"] = t.cancelling()
    try:
        await asyncio.wait_for(asyncio.sleep(1), 0.01)
        out["wait_for"] = "not raised"
    except TimeoutError:
        out["wait_for"] = "TimeoutError"
    out["cancelling_after_wait_for"] = t.cancelling()
    async with asyncio.timeout(5):  # does not expire: an inner one does
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)
            out["nested_inner"] = "not raised"
        except TimeoutError:
            out["nested_inner"] = "TimeoutError"
        await asyncio.sleep(0.001)  # the outer one still lets this through
        out["nested_outer_body_done"] = True
    out["cancelling_after_nested"] = t.cancelling()
    out["wait_for_result"] = await asyncio.wait_for(asyncio.sleep(0.001, result="slept"), 5)
    out["cancelling_end"] = t.cancelling()
    await answer(send, out)


async def task_groups(send: Callable[[Any], Any]) -> None:
    t = asyncio.current_task()
    assert t is not None

    async def child(n: int) -> int:
        await asyncio.sleep(0.001 * n)
        return n * 10

    async def failing() -> None:
        await asyncio.sleep(0.005)
        raise ValueError("child failed")

    out: dict[str, Any] = {}
    async with asyncio.TaskGroup() as tg:
        a = tg.create_task(child(1))
        b = tg.create_task(child(2))
    out["children"] = [a.result(), b.result()]
    out["cancelling_after_ok_group"] = t.cancelling()
    body_cut = False
    started = time.monotonic()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(failing())
            tg.create_task(asyncio.sleep(5))
            try:
                await asyncio.sleep(5)  # the group cancels the request's task here when the child fails
            except asyncio.CancelledError:
                body_cut = True
                out["cancelling_in_body"] = t.cancelling()
                raise
    except* ValueError as eg:
        out["caught"] = [type(e).__name__ + ": " + str(e) for e in eg.exceptions]
    out["body_cut"] = body_cut
    out["prompt"] = time.monotonic() - started < 2.5
    out["cancelling_after_failed_group"] = t.cancelling()
    await asyncio.sleep(0.001)  # the task runs on normally
    await answer(send, out)


async def self_cancel(send: Callable[[Any], Any], catch: bool, started: bool = False) -> None:
    t = asyncio.current_task()
    assert t is not None
    if started:  # the response is out in part before the cancellation
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
    out: dict[str, Any] = {"cancel_returned": t.cancel()}
    out["cancelling_requested"] = t.cancelling()
    if not catch:
        await asyncio.sleep(0)  # CancelledError leaves the app
        return await answer(send, {"unexpected": "still running"})
    try:
        await asyncio.sleep(0)
        out["raised"] = None
    except asyncio.CancelledError:
        out["raised"] = "CancelledError"
    out["cancelling_caught"] = t.cancelling()
    out["uncancel_returned"] = t.uncancel()
    out["cancelling_after_uncancel"] = t.cancelling()
    await asyncio.sleep(0.001)  # no cancellation left over
    out["done"] = t.done()
    await answer(send, out)


async def victim(receive: Callable[[], Any], send: Callable[[Any], Any], key: str, on_receive: bool) -> None:
    """Another task cancels this request's task while it sleeps; the finally records what happened."""
    t = asyncio.current_task()
    assert t is not None

    async def killer(target: asyncio.Task[Any]) -> None:
        await asyncio.sleep(0.05)
        RECORD[key + ":cancel_returned"] = target.cancel()

    k = asyncio.get_running_loop().create_task(killer(t))
    KEEP.add(k)
    k.add_done_callback(KEEP.discard)
    seen = "nothing"
    try:
        if on_receive:  # the body never comes: the task waits on the server's receive()
            await receive()
            await receive()
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        seen = "CancelledError"
        raise
    finally:
        RECORD[key] = {"finally": True, "seen": seen, "cancelling": t.cancelling()}
        print(f"app_task_app: victim {key} finally ran after {seen}", file=sys.stderr, flush=True)


async def done_callbacks(send: Callable[[Any], Any], key: str, eager: bool) -> str:
    t = asyncio.current_task()
    assert t is not None
    state = {"returned": False}

    def on_done(fut: Any) -> None:
        RECORD[key] = {"ran": True, "fut_is_task": fut is t, "done": fut.done(), "cancelled": fut.cancelled(),
                       "handler_had_returned": state["returned"], "result": repr(fut.result())}

    def extra(fut: Any) -> None:
        RECORD[key + ":extra"] = "ran"  # removed below: must never run

    t.add_done_callback(on_done)
    t.add_done_callback(extra)
    t.add_done_callback(extra)
    removed = t.remove_done_callback(extra)
    removed_again = t.remove_done_callback(extra)
    await answer(send, {"removed": removed, "removed_again": removed_again, "ran_yet": key in RECORD})
    if not eager:  # eager: the handler returns without ever suspending (a task that ends in its first step)
        await asyncio.sleep(0.001)
    state["returned"] = True
    return "returned by the app"  # the task's result (ASGI ignores it)


async def context_vars(send: Callable[[Any], Any], q: dict[str, str]) -> None:
    out: dict[str, Any] = {"at_start": VAR.get(None)}
    VAR.set(q["v"])
    await asyncio.sleep(0.001)
    out["after_await"] = VAR.get(None)

    async def child() -> str | None:
        seen = VAR.get(None)
        VAR.set("set by the child")  # the child's copy: the request's value stays
        return seen

    out["child_saw"] = await asyncio.get_running_loop().create_task(child())
    out["after_child"] = VAR.get(None)
    if "meet" in q:
        await meet(q["meet"], q["v"])
        out["after_meeting"] = VAR.get(None)
    await answer(send, out)


async def combinators(send: Callable[[Any], Any]) -> None:
    """gather, wait and a shielded child while a timeout cancels the request's task around it."""
    t = asyncio.current_task()
    assert t is not None

    async def child(n: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return n

    out: dict[str, Any] = {"gather": await asyncio.gather(child(1, 0.002), child(2, 0.001), child(3, 0))}
    loop = asyncio.get_running_loop()
    fast, slow = loop.create_task(child(4, 0)), loop.create_task(child(5, 5))
    done, pending = await asyncio.wait([fast, slow], return_when=asyncio.FIRST_COMPLETED)
    out["wait_first"] = [d.result() for d in done]
    slow.cancel()
    shielded = loop.create_task(child(6, 0.05))
    try:
        async with asyncio.timeout(0.005):
            await asyncio.shield(shielded)
        out["shield_timeout"] = "not raised"
    except TimeoutError:
        out["shield_timeout"] = "TimeoutError"
    out["shielded_child_cancelled"] = shielded.cancelled()
    out["shielded_child_result"] = await shielded
    out["cancelling_end"] = t.cancelling()
    await answer(send, out)


async def websocket(receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
    """A WebSocket session's task: the same task across its messages, with the facts of an HTTP request's."""
    t = asyncio.current_task()
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        await asyncio.sleep(0)
        doc = {"text": m.get("text"), "same_task": asyncio.current_task() is t, "facts": task_facts(t)}
        await send({"type": "websocket.send", "text": json.dumps(doc)})


async def yields(send: Callable[[Any], Any]) -> None:
    t = asyncio.current_task()
    out: dict[str, Any] = {}
    for _ in range(3):
        await bare_yield()
    out["bare_yield_resumed"] = True
    out["same_task_after_bare_yield"] = asyncio.current_task() is t
    other = asyncio.new_event_loop()
    try:
        fut = other.create_future()
        try:
            await fut
            out["foreign_future"] = "not raised"
        except RuntimeError:
            out["foreign_future"] = "RuntimeError"
    finally:
        other.close()
    try:
        await bad_yield()
        out["bad_yield"] = "not raised"
    except RuntimeError:
        out["bad_yield"] = "RuntimeError"
    await asyncio.sleep(0.001)
    out["runs_on"] = asyncio.current_task() is t
    await answer(send, out)


async def with_anyio(send: Callable[[Any], Any]) -> None:
    t = asyncio.current_task()
    assert t is not None
    out: dict[str, Any] = {}
    with anyio.move_on_after(0.01) as scope:
        await anyio.sleep(1)
    out["move_on_after_cancelled_caught"] = scope.cancelled_caught
    try:
        with anyio.fail_after(0.01):
            await anyio.sleep(1)
        out["fail_after"] = "not raised"
    except TimeoutError:
        out["fail_after"] = "TimeoutError"
    got: list[int] = []

    async def child(n: int) -> None:
        await anyio.sleep(0.001)
        got.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(child, 7)
    out["task_group_child"] = got
    loop_thread = threading.get_ident()
    worker = await anyio.to_thread.run_sync(threading.get_ident)
    out["to_thread_other_thread"] = worker != loop_thread
    info = anyio.get_current_task()
    out["anyio_task_name_is_str"] = isinstance(info.name, str)
    out["anyio_task_id_is_current"] = info.id == id(t)
    out["cancelling_end"] = t.cancelling()
    await answer(send, out)


async def spin(send: Callable[[Any], Any], key: str) -> None:
    """Yields with sleep(0) at least 1,000 times, and until a partner request was served meanwhile."""
    RECORD[key + ":spinning"] = True
    n = 0
    deadline = time.monotonic() + 20
    while (n < 1000 or not RECORD.get(key + ":poked")) and time.monotonic() < deadline:
        await asyncio.sleep(0)
        n += 1
    RECORD[key + ":spinning"] = False
    await answer(send, {"iterations": n, "poked_meanwhile": bool(RECORD.get(key + ":poked"))})


async def poke(send: Callable[[Any], Any], key: str) -> None:
    deadline = time.monotonic() + 10
    while not RECORD.get(key + ":spinning") and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    spinning = bool(RECORD.get(key + ":spinning"))
    RECORD[key + ":poked"] = True
    await answer(send, {"spinner_was_running": spinning})


async def hang(send: Callable[[Any], Any]) -> None:
    """Sleeps long; a graceful stop's drain timeout cancels it (the server log shows the finally)."""
    print("app_task_app: hang started", file=sys.stderr, flush=True)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        print("app_task_app: hang cancelled", file=sys.stderr, flush=True)
        raise
    finally:
        print("app_task_app: hang finally ran", file=sys.stderr, flush=True)
    await answer(send, {"unexpected": "not cancelled"})


# ------------------------------------------------------------------ FastAPI (Starlette, anyio)

BACKGROUND_DONE: list[str] = []
_API: list[Any] = []


def fastapi_app() -> Any:
    """The FastAPI app behind /fw/, made on first use (pydantic_core refuses sub-interpreters: the other routes
    also run in one)."""
    if _API:
        return _API[0]
    # Imported here, not at the top: the annotations below are evaluated at once (no `from __future__ import
    # annotations` in this module), as FastAPI reads them.
    from fastapi import BackgroundTasks, FastAPI, Request

    api = FastAPI()

    @api.middleware("http")  # a BaseHTTPMiddleware: anyio task groups and memory streams around each request
    async def stamp(request: Request, call_next: Any) -> Any:
        request.state.loop_thread = threading.get_ident()
        response = await call_next(request)
        response.headers["x-mw"] = "stamped"
        return response

    @api.get("/fw/async")
    async def fw_async(n: int) -> dict[str, Any]:
        t = asyncio.current_task()
        await asyncio.sleep(0)
        return {"n": n, "task": t is not None and asyncio.current_task() is t}

    @api.get("/fw/sync")
    def fw_sync(request: Request, n: int) -> dict[str, Any]:  # a def endpoint: run in Starlette's thread pool
        return {"n": n, "in_worker_thread": threading.get_ident() != request.state.loop_thread}

    @api.get("/fw/bg")
    async def fw_bg(tag: str, background: BackgroundTasks) -> dict[str, Any]:
        async def later() -> None:
            await asyncio.sleep(0.001)
            BACKGROUND_DONE.append(tag)

        background.add_task(later)
        return {"queued": tag}

    @api.get("/fw/done")
    async def fw_done() -> list[str]:
        return BACKGROUND_DONE

    _API.append(api)
    return api


# ------------------------------------------------------------------ the app


async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> Any:
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    if scope["type"] == "websocket":
        return await websocket(receive, send)
    path = scope["path"]
    if path.startswith("/fw/"):
        return await fastapi_app()(scope, receive, send)
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    key = q.get("key", "")
    if path == "/identity":
        return await identity(scope, receive, send, q)
    if path == "/timeouts":
        return await timeouts(send)
    if path == "/taskgroup":
        return await task_groups(send)
    if path == "/self-cancel":
        return await self_cancel(send, catch=True)
    if path == "/self-cancel-uncaught":
        return await self_cancel(send, catch=False, started="started" in q)
    if path == "/victim":
        return await victim(receive, send, key, on_receive="receive" in q)
    if path == "/done-callback":
        return await done_callbacks(send, key, eager="eager" in q)
    if path == "/record":
        return await answer(send, {k: v for k, v in RECORD.items() if k == key or k.startswith(key + ":")})
    if path == "/contextvars":
        return await context_vars(send, q)
    if path == "/combinators":
        return await combinators(send)
    if path == "/yields":
        return await yields(send)
    if path == "/anyio":
        return await with_anyio(send)
    if path == "/spin":
        return await spin(send, key)
    if path == "/poke":
        return await poke(send, key)
    if path == "/hang":
        return await hang(send)
    if path == "/raise-before":
        if "suspend" in q:
            await asyncio.sleep(0.001)
        raise ValueError("app task boom before the response")
    if path == "/raise-after":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        await asyncio.sleep(0.001)
        raise ValueError("app task boom after the response started")
    if path == "/hello":
        return await answer(send, "hello")
    await answer(send, {"not found": path}, status=404)
