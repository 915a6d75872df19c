"""cadeloop: a thread-per-core C++ server runtime for ASGI apps, and an asyncio loop in C++."""

from __future__ import annotations

from . import _core
from ._loop import EventLoopPolicy, Loop, install, new_event_loop, run
from ._api import Server
from .config import Config
from .server import ClientDisconnected, serve

__version__: str = _core.__version__

__all__ = ["__version__", "Loop", "EventLoopPolicy", "install", "new_event_loop", "run", "serve", "Config", "Server",
           "ClientDisconnected"]
