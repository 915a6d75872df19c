"""What a pair lets in: `limit_concurrency` (503 beyond it) and `limit_max_requests` (replace the pair after N).

Both are uvicorn's settings, and both are per pair, as uvicorn's are per
worker. Each wraps the app on the pair's loop thread only when it is set, so
a server without them calls the app directly (no cost per request).

* `limit_concurrency`: an HTTP request or a websocket that would be the
  (limit+1)-th one running in the pair is not given to the app: a request
  gets `503 Service Unavailable` at once (the I/O thread counts it under 5xx
  in /stats, as any response), and so does a websocket handshake (as
  uvicorn does), through the websocket.http.response extension. Each
  refusal is counted (`on_refused`): `concurrency_refusals` in /stats,
  `cadeloop_concurrency_refusals_total` in /metrics.
* `limit_max_requests`: after the pair's N-th request (N drawn once per pair
  from limit .. limit + 10%, so pairs started together are not replaced
  together) `on_reached` is called once; the pair then drains like on
  SIGTERM (requests in flight finish) and ends, and its supervisor starts a
  new one in its place.
"""

from __future__ import annotations

import random
from typing import Any, Awaitable, Callable

__all__ = ["admit", "max_requests_for_pair"]

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

_BODY = b"Service Unavailable: too many requests at once\n"


def max_requests_for_pair(limit: int, rng: random.Random | None = None) -> int:
    """The request count after which this pair is replaced: limit plus up to 10% jitter."""
    return limit + (rng or random).randint(0, limit // 10)


_HEADERS = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(_BODY)).encode()),
            (b"retry-after", b"1")]


async def _refuse(scope: dict[str, Any], send: Any) -> None:
    """503 with a short body; a websocket handshake gets it too (the websocket.http.response extension)."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 503, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": _BODY})
    elif scope["type"] == "websocket":
        await send({"type": "websocket.http.response.start", "status": 503, "headers": _HEADERS})
        await send({"type": "websocket.http.response.body", "body": _BODY})


def admit(app: ASGIApp, limit_concurrency: int | None, max_requests: int | None,
          on_reached: Callable[[], None], on_refused: Callable[[], None] = lambda: None) -> ASGIApp:
    """`app`, or `app` behind the limits that are set (lifespan always passes)."""
    if limit_concurrency is None and max_requests is None:
        return app
    running = 0
    served = 0

    async def admitted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal running, served
        if scope["type"] == "lifespan":
            await app(scope, receive, send)
            return
        if limit_concurrency is not None and running >= limit_concurrency:
            on_refused()
            await _refuse(scope, send)
            return
        if max_requests is not None:
            served += 1
            if served == max_requests:
                on_reached()
        running += 1
        try:
            await app(scope, receive, send)
        finally:
            running -= 1

    return admitted
