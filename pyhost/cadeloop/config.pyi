# Generated from the settings table by cadeloop.config.stub() (scripts/gen-config-doc). Do not edit.
import dataclasses
import os
from typing import Any, Iterable, Mapping, Sequence

from . import _core

__all__: list[str]
SettingError = _core.SettingError
SETTINGS: dict[str, dict[str, Any]]
ENV_PREFIX: str
CONFIG_VARIABLE: str
UVICORN_TRUST_VARIABLE: str

class Config:
    """Every server setting; the fields are the table's rows (docs/configuration.md)."""
    app: Any  # the ASGI app as module:attribute, e.g. "main:app"
    app_dir: str | None  # directory the app is imported from
    factory: bool  # the app is a factory: call it to get the ASGI app
    root_path: str  # the ASGI root_path (the mount point behind a proxy); scope path starts with it
    proxy_headers: bool  # take the client address and scheme from X-Forwarded-For/-Proto or Forwarded when the peer is in forwarded_allow_ips
    forwarded_allow_ips: str | Sequence[str]  # peers trusted with proxy headers: comma-separated addresses and networks (10.0.0.0/8), "unix" for a Unix-socket peer, or "*" for any (also read from FORWARDED_ALLOW_IPS)
    env_file: str | None  # KEY=VALUE lines put into the environment (unless already set) before settings are read and the app is imported
    lifespan: str  # ASGI lifespan protocol: auto (use it if the app supports it), on (required), off
    server_header: str  # value of the Server response header ("" for none)
    date_header: bool  # add a Date header to the app's responses that have none
    headers: str | Sequence[tuple[str | bytes, str | bytes]]  # response headers added to every app response, one "Name: value" per line (--header NAME:VALUE, repeatable)
    asyncio_tasks: bool  # run each request's app in an asyncio.Task, as uvicorn does, instead of cadeloop's native request task (same behaviour, fewer steps); for an app that needs isinstance(task, asyncio.Task)
    reload: bool  # development: restart the server when a watched file changes (one pair; refused with cores > 1)
    reload_dirs: str  # directories --reload watches, comma-separated (--reload-dir DIR, repeatable); empty: app_dir, else the current directory
    reload_include: str  # file name patterns --reload watches, comma-separated (--reload-include, repeatable)
    reload_exclude: str  # file and directory name patterns --reload ignores, comma-separated (--reload-exclude, repeatable)
    host: str  # address to listen on
    port: int  # TCP port to listen on, 0 for any free port
    uds: str | None  # listen on this Unix socket path instead of host:port
    uds_mode: str  # permission bits of the uds socket file, in octal (set whatever the umask)
    fd: int | None  # serve an inherited listening socket (systemd socket activation)
    backlog: int  # listen(2) backlog
    cores: int  # core pairs to run; 0 for one per usable CPU
    isolation: str  # where each pair's interpreter lives: auto, subinterpreters (own GIL, 3.12+) or processes
    pin: bool  # tie each pair's two threads to one CPU set
    serving_processes: int  # serving processes the sub-interpreter pairs are spread over (under one parent that keeps the sockets): a crash takes only its process's pairs; at most one per pair
    max_body: int | str | None  # largest request body (413 above)
    max_url: int | str  # longest request target (414 above)
    max_header_bytes: int | str  # largest request head (431 above)
    max_headers: int  # most header fields in a request (431 above)
    max_pipelined: int  # requests in flight per connection (pipelining)
    max_connections: int  # open connections above which accepting pauses
    max_requests_in_flight: int  # requests in flight (all connections) above which accepting pauses
    limit_concurrency: int | None  # requests and websockets a pair runs at once (uvicorn's name); beyond it a new request or websocket handshake gets 503 at once, counted as 5xx in /stats
    limit_max_requests: int | None  # requests after which a pair is replaced (uvicorn's name; each pair draws up to 10% more, so pairs are not replaced together): it drains, and a new one takes its place
    request_line_timeout: float | str  # time for a request head to arrive (408 after)
    keepalive_idle: float | str  # how long an idle keep-alive connection is kept
    linger_timeout: float | str  # how long a closing connection is read (and discarded) after its last response, so the client reads the answer before a reset
    grace: float | str  # time in-flight requests get to finish after SIGTERM/SIGINT
    body_timeout: float | str  # time without a byte of a request body the app waits for; then 408 (or a close if the response began) and the app sees http.disconnect
    body_min_rate: int | str  # slowest average request body rate accepted once body_timeout has passed since the body was first awaited (0: no minimum)
    write_timeout: float | str  # time without writing a byte of pending response output before the connection closes (the app's send() sees the disconnect)
    stuck_timeout: float | str  # an app thread that makes no progress this long while it has work marks its pair stuck: the pair stops accepting, its Python stack is logged, a stuck worker process is killed and restarted (0: no watchdog)
    drain_delay: float | str  # after the first SIGTERM/SIGINT, time during which /readyz answers 503 while the listener keeps accepting and requests are served, so a load balancer's health check takes the instance out before the drain closes anything (a second signal skips it)
    body_window: int | str  # request body bytes handed to the app and not yet read before reading pauses
    send_high_mark: int | str  # response bytes per connection after which send() waits for the client
    drain_low_mark: int | str  # unsent response bytes per connection at or below which a waiting send() resumes
    memory_budget: int | str  # unsent response bytes plus request body bytes not yet read by the app, per pair (the process holds pairs times it); above it new requests get 503 and the slowest clients are cut first; at 1.25 times it a send() of more than 4 KiB waits before its bytes are copied, and the client slowest to read is cut
    ws: str  # WebSockets: auto or on (served), off (an upgrade is an ordinary http request); uvicorn's names are taken too: none is off, websockets, wsproto and websockets-sansio are on
    ws_max_size: int | str  # largest WebSocket message a client may send, after decompression (closed with 1009 above)
    ws_max_queue: int  # WebSocket messages received and not yet taken by the app before reading pauses
    ws_ping_interval: float | str  # a WebSocket ping is sent after this long without a frame from the client (0: never)
    ws_ping_timeout: float | str  # a WebSocket client silent this long after a ping is dropped (the app sees 1006)
    ws_per_message_deflate: bool  # offer permessage-deflate compression (RFC 7692) to WebSocket clients that ask
    log_level: str  # least severe server log message shown
    log_config: str | None  # logging configuration file as uvicorn reads it: dictConfig .json or .yaml/.yml (needs PyYAML), else fileConfig .ini
    access_log: bool  # write one access log line per response
    access_log_format: str  # access log line format: "default", "json", or a template
    access_log_file: str | None  # file the access log is appended to
    access_log_queue: int  # access log lines queued per process before lines are dropped (and counted)
    stats_port: int | None  # port of the stats endpoint (/stats, /metrics, /healthz, /readyz)
    stats_host: str  # address the stats endpoint listens on
    stats_json_on_exit: str | None  # file the counters are written to as JSON at exit (and on SIGUSR1)
    stats_allowed_hosts: str | None  # comma-separated host names the stats endpoint answers (the Host header, port ignored); another Host gets 421, against DNS rebinding
    io_spin_us: int  # how long the I/O thread spins before it sleeps
    spin_us: int  # how long the app loop spins before it sleeps
    shared_cpu_yield_us: int  # when a pair's I/O and app threads are confined to the same single CPU: how long each yields the CPU to the other (while it is awake) and re-checks for work before it sleeps; 0: sleep at once
    solo_max_batch: int  # solo mode: when a pair's I/O thread has nothing to do, its app thread serves the sockets itself (one thread, no hand-over per request) until one of its passes reads more than this many requests or WebSocket messages; 0: the two threads always
    solo_busy_passes: int  # solo mode: the app thread also gives the sockets back after this many of its passes in a row found requests while its loop was busy (many clients, a request or two each pass); 0: not for that
    solo_spin_us: int  # solo mode: how long the app thread, serving the sockets, polls them before it sleeps, so a request that follows closely is taken without a wake-up (adaptive: after 8 polls that found nothing, one sleep in 16 polls); 0: sleep at once
    ssl_certfile: str | None  # PEM certificate (chain) of the server; set, every connection is TLS (HTTPS, WSS)
    ssl_keyfile: str | None  # PEM private key of the certificate
    ssl_keyfile_password: str | None  # password of an encrypted ssl_keyfile
    ssl_ca_certs: str | None  # PEM bundle of the CAs client certificates are verified against (mTLS)
    ssl_cert_reqs: int  # client certificates: 0 not asked for, 1 optional (verified when given), 2 required
    ssl_ciphers: str | None  # TLS 1.2 cipher list in OpenSSL's syntax
    ssl_ciphersuites: str | None  # TLS 1.3 cipher suites, colon-separated (TLS_AES_128_GCM_SHA256:...)
    ssl_min_version: str  # oldest TLS version a client may use: 1.2 or 1.3
    ssl_ticket_rotation: float | str  # how often the session-ticket key changes (every pair shares it; a ticket resumes for one to two periods)
    def __init__(
        self,
        app: Any = None,
        app_dir: str | None = None,
        factory: bool = False,
        root_path: str = '',
        proxy_headers: bool = True,
        forwarded_allow_ips: str | Sequence[str] = '127.0.0.1',
        env_file: str | None = None,
        lifespan: str = 'auto',
        server_header: str = 'cadeloop',
        date_header: bool = True,
        headers: str | Sequence[tuple[str | bytes, str | bytes]] = '',
        asyncio_tasks: bool = False,
        reload: bool = False,
        reload_dirs: str = '',
        reload_include: str = '*.py',
        reload_exclude: str = '.*, *.py[cod], *.sw.*, ~*',
        host: str = '127.0.0.1',
        port: int = 8000,
        uds: str | None = None,
        uds_mode: str = '0660',
        fd: int | None = None,
        backlog: int = 1024,
        cores: int = 1,
        isolation: str = 'auto',
        pin: bool = False,
        serving_processes: int = 2,
        max_body: int | str | None = 1073741824,
        max_url: int | str = 8192,
        max_header_bytes: int | str = 65536,
        max_headers: int = 100,
        max_pipelined: int = 16,
        max_connections: int = 10000,
        max_requests_in_flight: int = 4096,
        limit_concurrency: int | None = None,
        limit_max_requests: int | None = None,
        request_line_timeout: float | str = 10.0,
        keepalive_idle: float | str = 5.0,
        linger_timeout: float | str = 2.0,
        grace: float | str = 30.0,
        body_timeout: float | str = 10.0,
        body_min_rate: int | str = 240,
        write_timeout: float | str = 30.0,
        stuck_timeout: float | str = 10.0,
        drain_delay: float | str = 0.0,
        body_window: int | str = 262144,
        send_high_mark: int | str = 1048576,
        drain_low_mark: int | str = 65536,
        memory_budget: int | str = 67108864,
        ws: str = 'auto',
        ws_max_size: int | str = 16777216,
        ws_max_queue: int = 32,
        ws_ping_interval: float | str = 20.0,
        ws_ping_timeout: float | str = 20.0,
        ws_per_message_deflate: bool = True,
        log_level: str = 'info',
        log_config: str | None = None,
        access_log: bool = False,
        access_log_format: str = 'default',
        access_log_file: str | None = None,
        access_log_queue: int = 8192,
        stats_port: int | None = None,
        stats_host: str = '127.0.0.1',
        stats_json_on_exit: str | None = None,
        stats_allowed_hosts: str | None = None,
        io_spin_us: int = 0,
        spin_us: int = 0,
        shared_cpu_yield_us: int = 50,
        solo_max_batch: int = 4,
        solo_busy_passes: int = 4,
        solo_spin_us: int = 50,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_keyfile_password: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_cert_reqs: int = 0,
        ssl_ciphers: str | None = None,
        ssl_ciphersuites: str | None = None,
        ssl_min_version: str = '1.2',
        ssl_ticket_rotation: float | str = 3600.0,
    ) -> None: ...
    def check(self) -> None: ...
    def table_values(self) -> dict[str, Any]: ...
    def core_options(self) -> dict[str, Any]: ...
    def scheme(self) -> str: ...
    def describe_listen(self) -> str: ...
    @classmethod
    def from_env(cls, prefix: str = ..., environ: Mapping[str, str] | None = ...) -> Config: ...
    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Config: ...

@dataclasses.dataclass(frozen=True)
class Resolved:
    config: Config
    origins: dict[str, str]
    file: str | None = ...

def resolve(
    *,
    file: str | os.PathLike[str] | None = ...,
    environ: Mapping[str, str] | None = ...,
    prefix: str = ...,
    flags: Iterable[tuple[str, str]] = ...,
    arguments: Mapping[str, Any] | None = ...,
    arguments_origin: str = ...,
    use_config_variable: bool = ...,
) -> Resolved: ...
def format_config(resolved: Resolved) -> str: ...
def reference() -> str: ...
def stub() -> str: ...
