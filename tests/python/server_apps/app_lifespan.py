"""The lifespan protocol as the test apps answer it: startup and shutdown complete, each after its hook.

The apps import it as a sibling module: the server puts the app directory (--app-dir) on sys.path before it
imports an app, in every interpreter and worker process.
"""

from __future__ import annotations

from typing import Any, Callable


async def serve_lifespan(receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any],
                         on_startup: Callable[[], None] | None = None,
                         on_shutdown: Callable[[], None] | None = None) -> None:
    """Answers lifespan.startup and lifespan.shutdown (calling the hooks first) until the shutdown."""
    while True:
        m = await receive()
        if m["type"] == "lifespan.startup":
            if on_startup is not None:
                on_startup()
            await send({"type": "lifespan.startup.complete"})
        elif m["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
