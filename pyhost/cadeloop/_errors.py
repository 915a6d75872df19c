"""The exceptions the server raises to its caller, each with one line for the user.

The bottom of the package's imports: it needs nothing but `_core`.
`cadeloop.server` re-exports every name here, which is where users catch them.
"""

from __future__ import annotations

from . import _core

__all__ = ["AppLoadError", "StartupError", "ClientDisconnected"]

#: Raised by an ASGI `receive()`/`send()` after the client went away (defined in C++).
ClientDisconnected = _core.ClientDisconnected


class AppLoadError(Exception):
    """APP names a module or attribute that does not exist (one line for the user)."""

    # Named where users import it, so a traceback reads as it always did.
    __module__ = "cadeloop.server"


class StartupError(Exception):
    """The server could not start (one line for the user); `exit_code` is what the command exits with."""

    __module__ = "cadeloop.server"

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
