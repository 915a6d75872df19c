"""Type stub for cadeloop's native module."""

import contextvars
from typing import Any, Callable, Iterable

# --- build and runtime facts (pyhost/bind_info.cpp) ---

__version__: str
PY_VERSION_BUILT: str

def own_gil_supported() -> bool: ...
def in_main_interpreter() -> bool: ...

# Core pairs in own-GIL sub-interpreters (pyhost/asgi/interpreters.cpp; see cadeloop._supervisor). Slots are
# plain C++ records shared by every interpreter of the process; no Python object crosses them.
def interp_start(module: str, function: str, argument: str, cpus: list[int], thread_grace: float) -> int:
    """Starts a native thread running module.function(argument, id) -> (code, message, stats) in a new
    own-GIL sub-interpreter, then ends that interpreter. Returns the slot id. Main thread."""
def interp_wait(id: int, timeout: float, for_ready: bool = False) -> bool:
    """Waits (GIL released, one slice) for the slot to finish (or report ready); True if it did."""
def interp_status(id: int) -> tuple[bool, bool, bool, str, int, str, str]:
    """(ready, finished, ended, description, exit_code, message, stats JSON) of a slot."""
def interp_release(id: int) -> None:
    """Joins a finished slot's thread and forgets the slot. Main thread."""
def interp_request_stop_all(level: int) -> int:
    """Stops every running slot (1: drain, 2: drain cut short); returns how many. Any thread."""
def interp_stop_fd(id: int) -> int:
    """The eventfd a slot's loop watches for stop requests. The slot's own interpreter."""
def interp_take_stop(id: int) -> int:
    """Clears the slot's stop eventfd and returns its stop level. The slot's own interpreter."""
def interp_report_ready(id: int, description: str) -> None:
    """The slot's pair listens now. The slot's own interpreter."""
def set_parent_death_signal(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG, sig) for this process (worker processes)."""

# --- the event loop core (pyhost/loop/: LoopCore in loop_core.cpp with its methods in
# loop_schedule.cpp, loop_fd_table.cpp, loop_pass.cpp; Handle and TimerHandle in loop_handle.cpp;
# SocketTransportCore in loop_transport.cpp) ---

class Handle:
    """A callback scheduled on a cadeloop loop (asyncio.Handle semantics). Made only by the loop."""

    _callback: Callable[..., object] | None
    _args: tuple[Any, ...] | None
    _loop: LoopCore
    _context: contextvars.Context
    _cancelled: bool
    _repr: str | None
    _source_traceback: Any
    def cancel(self) -> None: ...
    def cancelled(self) -> bool: ...
    def get_context(self) -> contextvars.Context: ...
    def _run(self) -> None: ...
    def _repr_info(self) -> list[str]: ...

class TimerHandle(Handle):
    """A timed callback (asyncio.TimerHandle semantics); cancel() takes it out of the heap at once."""

    _when: float
    _scheduled: bool
    def when(self) -> float: ...

class SocketTransportCore:
    """The C++ half of a cadeloop socket transport (cadeloop._loop._SocketTransport). Made by the loop."""

    closing: bool
    eof: bool
    paused: bool
    protocol_paused: bool
    conn_lost: int
    high_water: int
    low_water: int
    empty_waiter: Any
    @property
    def reading(self) -> bool: ...
    @property
    def writing(self) -> bool: ...
    @property
    def buffer_size(self) -> int: ...
    @property
    def fd(self) -> int: ...
    def __len__(self) -> int: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview], /) -> None: ...
    def start_reading(self) -> None: ...
    def pause_reading(self) -> bool: ...
    def resume_reading(self) -> bool: ...
    def discard(self) -> None: ...
    def clear(self) -> None: ...
    def set_protocol(self, protocol: Any, buffered: bool, /) -> None: ...
    def unregister(self) -> None: ...
    def release(self) -> None: ...
    def flush(self) -> None: ...

class PipeTransportCore:
    """The C++ half of a cadeloop pipe transport (cadeloop._loop_pipes). Made by the loop's pipe transports."""

    protocol: Any
    closing: bool
    conn_lost: int
    def __init__(self, loop: LoopCore, owner: Any, fd: int, max_size: int, /) -> None: ...
    def read_ready(self) -> None: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def write_ready(self) -> None: ...
    def attach(self, buffer: bytearray, /) -> None: ...
    def release(self) -> None: ...

class LoopCore:
    """The C++ scheduling core of cadeloop.Loop; use cadeloop.Loop."""

    _handle_type: type[Handle]
    _timer_handle_type: type[TimerHandle]
    _transport_type: type[SocketTransportCore]
    _closed: bool
    _stopping: bool
    _debug: bool
    _task_factory: Any
    def get_debug(self) -> bool: ...
    def create_future(self) -> Any: ...
    def create_task(self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None) -> Any: ...
    def call_soon(self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None) -> Handle: ...
    def call_soon_threadsafe(
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> Handle: ...
    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> TimerHandle: ...
    def call_at(
        self, when: float, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> TimerHandle: ...
    def time(self) -> float: ...
    def _run_once(self) -> None: ...
    def _run_until_stopped(self) -> None: ...
    def _add_callback(self, handle: Any) -> None: ...
    def _timer_handle_cancelled(self, handle: Any) -> None: ...
    def _add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> Handle: ...
    def _add_writer(self, fd: Any, callback: Callable[..., object], *args: Any) -> Handle: ...
    def _remove_reader(self, fd: Any) -> bool: ...
    def _remove_writer(self, fd: Any) -> bool: ...
    def _fd_key(self, fd: Any) -> tuple[int, Handle | None, Handle | None] | None: ...
    def _fd_list(self) -> list[int]: ...
    def _wake(self) -> None: ...
    def _release_core(self) -> None: ...
    def _core_stats(self) -> dict[str, Any]: ...
    def _set_spin(self, spin_us: int, adaptive: bool, /) -> None: ...
    def _make_transport_core(self, owner: Any, fd: int, /) -> SocketTransportCore: ...
    def _attach_source(self, capsule: Any, /) -> None: ...
    def _detach_source(self) -> None: ...
    def _watch_child(self, pidfd: int, pid: int, process_exited: Callable[[int], object],
                     children: dict[int, Any], /) -> None: ...

# --- the HTTP server (pyhost/asgi/: ServerCore in server_core.cpp; the ASGI bridge in bridge*.cpp;
# Request, Ready and ClientDisconnected in request_type.cpp) ---

class ClientDisconnected(OSError):
    """Raised by an ASGI send() once the client has gone (ASGI spec 2.4)."""

class Request:
    """One HTTP request being served; its task's done callback. Made by ServerCore."""

    def __call__(self, task: Any, /) -> None: ...

class Ready:
    """An already finished receive()/send() result (awaiting it never suspends)."""

    def __await__(self) -> Any: ...

class ServerCore:
    """One core pair (native I/O thread) and its ASGI bridge. Loop thread; see cadeloop.server."""

    def __init__(
        self,
        app: Callable[..., Any],
        loop: Any,
        options: dict[str, Any],
        on_error: Callable[[str, BaseException | None], None],
        on_stopped: Callable[[], None],
    ) -> None: ...
    def start(self) -> str: ...
    def request_stop(self) -> None: ...
    def join(self) -> None: ...
    @property
    def description(self) -> str: ...
    @property
    def port(self) -> int: ...
    def source_capsule(self) -> Any: ...
    def set_state(self, state: dict[str, Any] | None) -> None: ...
    def active_tasks(self) -> int: ...
    def cancel_tasks(self) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, Any]:
        """The pair's counters (from its stats page: see StatsRegion.snapshot for the keys) plus the
        bridge's (app_requests, eager_completed, drain_waits, app_passes_with_work, active_tasks)."""

# --- per-pair stats pages in shared memory (pyhost/asgi/server_core.cpp; runtime/stats/.../stats_page.hpp) ---
# ServerCore options that place a pair on a page: "stats_region" (a StatsRegion) + "stats_index",
# or, from another interpreter, "stats_page_address" (StatsRegion.address(i)) + "stats_index".
# Every other option is a setting of the table by name, as core_options() writes it.

class StatsRegion:
    """Per-pair stats pages in one MAP_SHARED mapping, made in the main process before workers are
    forked (they inherit it). Pair i writes page i; any thread of any process that has the mapping
    reads every page without locks. Its methods only read."""

    def __init__(self, pages: int) -> None: ...
    def __len__(self) -> int: ...
    def address(self, index: int) -> int:
        """Page `index`'s address, for ServerCore's stats_page_address option in a sub-interpreter.
        Valid while this object lives (keep it alive in the main interpreter)."""
    def snapshot(self, index: int) -> dict[str, Any]:
        """valid, index, pid, state ('unused', 'starting', 'serving', 'draining', 'stopped'),
        started_unix_ms, the counters (requests, responses, responses_1xx..responses_5xx, bytes_in,
        bytes_out, connections_open, connections_accepted, requests_in_flight, inbound_depth,
        outbound_depth, wakeups_to_app, wakeups_to_io, io_parks, app_parks, spins, spin_hits,
        loop_ticks, protocol_errors, timeouts, app_errors, access_log_dropped, ...), latency_count,
        latency_sum_us, latency_p50_us/p90_us/p99_us/p999_us and latency_buckets (counts)."""
    def snapshot_all(self) -> list[dict[str, Any]]: ...
    def totals(self) -> dict[str, Any]:
        """Every page in use summed (histograms merged: the percentiles are over all pairs)."""

def latency_bucket_bounds_us() -> list[float]:
    """Exclusive upper bound (µs) of each latency bucket; the last is inf."""
def flush_access_logs(timeout: float = 5.0) -> bool:
    """Waits until every access-log line queued in this process is written; call before exiting."""
def check_forwarded_allow_ips(list: str) -> str:
    """'' if a forwarded_allow_ips value is good, else why an entry is refused."""
def check_access_log_format(format: str) -> str:
    """'' if the access-log format is valid, else one line naming the problem."""
def core_options(values: dict[str, Any]) -> dict[str, Any]:
    """The dict ServerCore reads: every setting by name, checked through the table (a missing one is
    its default); a removed limit (None) is the core's one "no limit" number."""
def pair_options_preview(options: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """For tests: (setting, option field, value read back in the setting's terms) for every C++
    option field a setting fills in the pair ServerCore would build from `options`."""

# --- the server log (pyhost/bind_log.cpp; runtime/server_log.hpp) ---
# One process-wide spdlog logger on stderr, shared by every interpreter and native thread.

def log(level: int, message: str) -> None:
    """Writes 'cadeloop: <message>' to stderr (one write, before returning) when `level`, a logging
    level number (DEBUG 10 .. CRITICAL 50), is at least log_level(). Releases the GIL while writing."""
def set_log_level(name: str) -> None:
    """The least severe level written, for the whole process: debug, info, warning, error or critical
    (ValueError otherwise). Info until set."""
def log_level() -> str:
    """The native server log's level name."""

# --- the settings table (pyhost/bind_config.cpp; config/ in C++) ---

class SettingError(ValueError):
    """A refused setting: str(e) is one line naming the file and line, the variable or the flag."""

    kind: str  # "unknown", "invalid", "out_of_range" or "file"

def settings_table() -> list[dict[str, Any]]: ...
def environment_names_not_settings() -> list[str]: ...
def check_setting(name: str, value: object, where: str | None = None) -> Any: ...
def format_setting(name: str, value: object, toml: bool = False) -> str: ...
def resolve_settings(
    file: str | None = None,
    environ: dict[str, str] | None = None,
    prefix: str = "CADELOOP_",
    flags: list[tuple[str, str]] = ...,
    arguments: dict[str, Any] | None = None,
    arguments_origin: str = "serve()",
) -> list[tuple[str, Any, str]]: ...
