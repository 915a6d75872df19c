#!/usr/bin/env python3
"""One loop benchmark workload on one loop implementation, in this process.

    python bench/loop/workloads.py LOOP WORKLOAD      # LOOP: asyncio | cadeloop | uvloop

Prints one JSON line {"value": ..., "unit": ...}: operations per second
(higher is better). bench/loop/run.py starts one fresh process per sample so
no run inherits another's heap, caches or JIT-less warm-up.

The TCP echo workloads run the server and its clients on the same loop in
this process (protocol-based: asyncio.Protocol on both sides, no streams), so
the figure is the loop's cost for both ends of every connection. The UDP echo
workload does the same with asyncio.DatagramProtocol on both ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import threading
import time
from typing import Any, Callable

Loop = asyncio.AbstractEventLoop

# Every workload reads the clock twice, at the start and at the end of what it
# times. Each reading also takes this process's CPU time (utime + stime of all
# its threads, from /proc/self/stat), so the figure can be given per CPU
# second as well: on a loaded machine the wall clock counts time other
# processes had the CPU, the CPU time does not.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_readings: list[tuple[float, float]] = []


def _cpu_seconds() -> float:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15)


def _now() -> float:
    wall = time.perf_counter()
    _readings.append((wall, _cpu_seconds()))
    return wall


def make_loop(name: str) -> Loop:
    if name == "asyncio":
        return asyncio.SelectorEventLoop()
    if name == "cadeloop":
        import cadeloop

        return cadeloop.Loop()
    if name == "uvloop":
        import uvloop  # type: ignore[import-not-found]

        return uvloop.new_event_loop()
    raise SystemExit(f"unknown loop {name!r}")


# --------------------------------------------------------------- scheduling


def call_soon_chain(loop: Loop, n: int = 500_000) -> float:
    """One callback at a time, each scheduling the next: the cost of one loop pass."""
    left = n

    def step() -> None:
        nonlocal left
        left -= 1
        if left:
            loop.call_soon(step)
        else:
            loop.stop()

    loop.call_soon(step)
    t0 = _now()
    loop.run_forever()
    return n / (_now() - t0)


def call_soon_burst(loop: Loop, n: int = 500_000) -> float:
    """n callbacks queued at once, then run: handle creation and the ready queue."""
    noop = lambda: None  # noqa: E731
    t0 = _now()
    for _ in range(n):
        loop.call_soon(noop)
    loop.call_soon(loop.stop)
    loop.run_forever()
    return n / (_now() - t0)


def timer_schedule_cancel(loop: Loop, n: int = 300_000) -> float:
    """call_later then cancel, n times (a timeout that did not expire)."""
    noop = lambda: None  # noqa: E731
    rng = random.Random(1)
    delays = [1 + rng.random() for _ in range(1000)]
    t0 = _now()
    handles = [loop.call_later(delays[i % 1000], noop) for i in range(n)]
    for h in handles:
        h.cancel()
    loop.call_soon(loop.stop)
    loop.run_forever()
    return n / (_now() - t0)


def timer_fire(loop: Loop, n: int = 200_000) -> float:
    """n timers due within 10 ms, all fired."""
    rng = random.Random(2)
    count = 0

    def fired() -> None:
        nonlocal count
        count += 1
        if count == n:
            loop.stop()

    t0 = _now()
    now = loop.time()
    for _ in range(n):
        loop.call_at(now + rng.random() * 0.01, fired)
    loop.run_forever()
    return n / (_now() - t0)


def sleep0_chain(loop: Loop, n: int = 300_000) -> float:
    """One task awaiting asyncio.sleep(0) n times."""

    async def main() -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    t0 = _now()
    loop.run_until_complete(main())
    return n / (_now() - t0)


def task_spawn(loop: Loop, n: int = 200_000) -> float:
    """create_task of a coroutine that returns at once, awaited one by one."""

    async def child() -> int:
        return 1

    async def main() -> None:
        create = loop.create_task
        for _ in range(n):
            await create(child())

    t0 = _now()
    loop.run_until_complete(main())
    return n / (_now() - t0)


def threadsafe_throughput(loop: Loop, n: int = 400_000) -> float:
    """4 threads call call_soon_threadsafe n/4 times each while the loop runs them."""
    threads_n = 4
    per = n // threads_n
    count = 0
    done = loop.create_future()

    def hit() -> None:
        nonlocal count
        count += 1
        if count == per * threads_n:
            done.set_result(None)

    def producer() -> None:
        cst = loop.call_soon_threadsafe
        for _ in range(per):
            cst(hit)

    threads = [threading.Thread(target=producer) for _ in range(threads_n)]
    t0 = _now()
    for t in threads:
        t.start()
    loop.run_until_complete(done)
    elapsed = _now() - t0
    for t in threads:
        t.join()
    return n / elapsed


def future_chain(loop: Loop, n: int = 300_000) -> float:
    """A future resolved by call_soon and awaited, n times in a row."""

    async def main() -> None:
        create = loop.create_future
        soon = loop.call_soon
        for _ in range(n):
            f = create()
            soon(f.set_result, None)
            await f

    t0 = _now()
    loop.run_until_complete(main())
    return n / (_now() - t0)


def gather_fan_in(loop: Loop, n: int = 100_000, width: int = 100) -> float:
    """gather() of `width` coroutines that each sleep(0) once, n/width times."""

    async def child() -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        for _ in range(n // width):
            await asyncio.gather(*[child() for _ in range(width)])

    t0 = _now()
    loop.run_until_complete(main())
    return n / (_now() - t0)


def queue_ping_pong(loop: Loop, n: int = 200_000) -> float:
    """Two tasks pass a token through two asyncio.Queues n times."""

    async def main() -> None:
        a: asyncio.Queue[int] = asyncio.Queue()
        b: asyncio.Queue[int] = asyncio.Queue()

        async def pong() -> None:
            for _ in range(n):
                b.put_nowait(await a.get())

        t = loop.create_task(pong())
        for i in range(n):
            a.put_nowait(i)
            await b.get()
        await t

    t0 = _now()
    loop.run_until_complete(main())
    return n / (_now() - t0)


def task_fib(loop: Loop, depth: int = 21) -> float:
    """fib(depth) where every call is a task: a tree of 2*fib(depth)-1 tasks."""
    tasks = 0

    async def fib(k: int) -> int:
        nonlocal tasks
        tasks += 1
        if k < 2:
            return k
        create = loop.create_task
        return await create(fib(k - 1)) + await create(fib(k - 2))

    t0 = _now()
    assert loop.run_until_complete(fib(depth)) == 10946
    return tasks / (_now() - t0)


# --------------------------------------------------------------- TCP echo


class _EchoServer(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class _EchoClient(asyncio.Protocol):
    def __init__(self, payload: bytes, rounds: int, done: asyncio.Future[None], counter: list[int]) -> None:
        self.payload = payload
        self.rounds = rounds
        self.done = done
        self.counter = counter
        self.pending = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.pending = len(self.payload)
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.pending -= len(data)
        if self.pending > 0:
            return
        self.counter[0] += 1
        self.rounds -= 1
        if self.rounds == 0:
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)
            return
        self.pending = len(self.payload)
        self.transport.write(self.payload)


def _tcp_echo(loop: Loop, conns: int, size: int, total_rounds: int) -> float:
    """Round trips per second: each connection sends `size` bytes and waits for all of them back."""
    payload = b"x" * size
    rounds = max(1, total_rounds // conns)

    async def main() -> float:
        server = await loop.create_server(_EchoServer, "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        counter = [0]
        dones = [loop.create_future() for _ in range(conns)]
        clients = []
        # Connected first, then timed: connection set-up is not what this measures.
        starts = []
        for d in dones:
            tr, pr = await loop.create_connection(
                lambda d=d: _EchoClient(payload, rounds, d, counter), "127.0.0.1", port
            )
            tr.pause_reading()
            clients.append((tr, pr))
            starts.append(tr)
        for tr in starts:
            tr.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The clients' first write already went out in connection_made; the
        # clock starts when their replies are allowed in.
        t0 = _now()
        for tr in starts:
            tr.resume_reading()
        await asyncio.gather(*dones)
        elapsed = _now() - t0
        server.close()
        await server.wait_closed()
        return counter[0] / elapsed

    return loop.run_until_complete(main())


def tcp_echo_1k_1(loop: Loop) -> float:
    return _tcp_echo(loop, 1, 1024, 60_000)


def tcp_echo_1k_64(loop: Loop) -> float:
    return _tcp_echo(loop, 64, 1024, 120_000)


def tcp_echo_64k_8(loop: Loop) -> float:
    return _tcp_echo(loop, 8, 65536, 8_000)


# --------------------------------------------------------------- UDP echo


class _UdpEchoServer(asyncio.DatagramProtocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)


class _UdpEchoClient(asyncio.DatagramProtocol):
    def __init__(self, payload: bytes, rounds: int, done: asyncio.Future[None], counter: list[int]) -> None:
        self.payload = payload
        self.rounds = rounds
        self.done = done
        self.counter = counter

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.counter[0] += 1
        self.rounds -= 1
        if self.rounds == 0:
            if not self.done.done():
                self.done.set_result(None)
            return
        self.transport.sendto(self.payload)

    def error_received(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


def _udp_echo(loop: Loop, clients: int, size: int, total_rounds: int) -> float:
    """Round trips per second: each connected client sends one datagram and waits for it back.

    DatagramProtocol on both ends, one process, one loop: the server replies
    with sendto(data, addr) to the address recvfrom gave it, each client is a
    connected endpoint (remote_addr) sending with sendto(data).
    """
    payload = b"u" * size
    rounds = max(1, total_rounds // clients)

    async def main() -> float:
        server, _ = await loop.create_datagram_endpoint(_UdpEchoServer, local_addr=("127.0.0.1", 0))
        port = server.get_extra_info("sockname")[1]
        counter = [0]
        dones = [loop.create_future() for _ in range(clients)]
        ends = []
        for d in dones:
            tr, _ = await loop.create_datagram_endpoint(
                lambda d=d: _UdpEchoClient(payload, rounds, d, counter), remote_addr=("127.0.0.1", port)
            )
            ends.append(tr)
        t0 = _now()
        for tr in ends:
            tr.sendto(payload)
        # A datagram lost on loopback would stall a client: bounded, and reported.
        await asyncio.wait_for(asyncio.gather(*dones), 120)
        elapsed = _now() - t0
        for tr in ends:
            tr.close()
        server.close()
        return counter[0] / elapsed

    return loop.run_until_complete(main())


def udp_echo_256_8(loop: Loop) -> float:
    return _udp_echo(loop, 8, 256, 100_000)


class _PipeEnd(asyncio.Protocol):
    """The reading end of a pipe ping-pong: counts bytes, calls back per full message."""

    def __init__(self, size: int, on_message: Callable[[], None]) -> None:
        self.size = size
        self.got = 0
        self.on_message = on_message

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        while self.got >= self.size:
            self.got -= self.size
            self.on_message()


def pipe_ping_pong_1k(loop: Loop, rounds: int = 100_000) -> float:
    """Round trips per second: a 1 KiB message through two os.pipe()s and back, all four ends
    connect_read_pipe / connect_write_pipe transports of this loop (protocol-based)."""
    size = 1024
    payload = b"p" * size

    async def main() -> float:
        a_r, a_w = os.pipe()
        b_r, b_w = os.pipe()
        done = loop.create_future()
        count = [0]
        ends: dict[str, Any] = {}

        def at_far_end() -> None:  # echo back
            ends["back"].write(payload)

        def at_near_end() -> None:
            count[0] += 1
            if count[0] >= rounds:
                if not done.done():
                    done.set_result(None)
                return
            ends["out"].write(payload)

        ends["out"], _ = await loop.connect_write_pipe(asyncio.Protocol, open(a_w, "wb", buffering=0))
        far, _ = await loop.connect_read_pipe(lambda: _PipeEnd(size, at_far_end), open(a_r, "rb", buffering=0))
        ends["back"], _ = await loop.connect_write_pipe(asyncio.Protocol, open(b_w, "wb", buffering=0))
        near, _ = await loop.connect_read_pipe(lambda: _PipeEnd(size, at_near_end), open(b_r, "rb", buffering=0))
        t0 = _now()
        ends["out"].write(payload)
        await done
        elapsed = _now() - t0
        for tr in (ends["out"], ends["back"], far, near):
            tr.close()
        await asyncio.sleep(0)
        return rounds / elapsed

    return loop.run_until_complete(main())


def _sock_echo(loop: Loop, size: int, rounds: int) -> float:
    """loop.sock_sendall / loop.sock_recv (low-level socket calls, no transport):
    a client coroutine sends `size` bytes over a socketpair and waits for them
    back; a server coroutine receives and echoes. Every sock_recv of the
    waiting side has to wait for its fd (one registration each)."""
    payload = b"x" * size

    async def main() -> float:
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)

        async def server() -> None:
            for _ in range(rounds):
                got = 0
                while got < size:
                    data = await loop.sock_recv(b, 65536)
                    got += len(data)
                    await loop.sock_sendall(b, data)

        srv = asyncio.ensure_future(server())
        t0 = _now()
        for _ in range(rounds):
            await loop.sock_sendall(a, payload)
            got = 0
            while got < size:
                got += len(await loop.sock_recv(a, 65536))
        t1 = _now()
        await srv
        a.close()
        b.close()
        return rounds / (t1 - t0)

    return loop.run_until_complete(main())


# --------------------------------------------------------------- accept churn


class _ChurnServer(asyncio.Protocol):
    def __init__(self, made: list[Any], lost: list[Any]) -> None:
        self.made = made
        self.lost = lost

    def connection_made(self, transport: Any) -> None:
        self.made[0] += 1
        if self.made[0] == self.made[1] and not self.made[2].done():
            self.made[2].set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost[0] += 1
        if self.lost[0] == self.lost[1] and not self.lost[2].done():
            self.lost[2].set_result(None)


def _accept_churn(loop: Loop, total: int, batch: int, python_accept: bool = False) -> float:
    """Connections per second made, accepted and closed against a server on this loop.

    Clients are plain blocking sockets (connect() on loopback completes into the
    listen queue at once; close() with SO_LINGER 0 sends a reset, so no
    TIME_WAIT uses up ports): `batch` connect, the server's protocol sees each
    connection_made, then all close and the server sees each connection_lost.
    python_accept: on cadeloop, asyncio's own Python accept path instead of the
    C++ one (the figure before it), for an A/B in one run.
    """
    if python_accept and type(loop).__module__.startswith("cadeloop"):
        loop._start_serving = asyncio.SelectorEventLoop._start_serving.__get__(loop)  # type: ignore[attr-defined]
    linger = __import__("struct").pack("ii", 1, 0)

    async def main() -> float:
        made: list[Any] = [0, 0, None]
        lost: list[Any] = [0, 0, None]
        server = await loop.create_server(lambda: _ChurnServer(made, lost), "127.0.0.1", 0, backlog=1024)
        address = server.sockets[0].getsockname()
        done = 0
        t0 = _now()
        while done < total:
            n = min(batch, total - done)
            made[1] += n
            lost[1] += n
            made[2] = loop.create_future()
            lost[2] = loop.create_future()
            clients = []
            for _ in range(n):
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                c.connect(address)
                clients.append(c)
            await asyncio.wait_for(made[2], 60)
            for c in clients:
                c.close()
            await asyncio.wait_for(lost[2], 60)
            done += n
        elapsed = _now() - t0
        server.close()
        await server.wait_closed()
        return done / elapsed

    return loop.run_until_complete(main())


def subprocess_spawn_wait(loop: Loop, n: int = 2000, width: int = 8) -> float:
    """Children per second: `width` at a time, each /bin/true started with
    create_subprocess_exec (no pipes) and waited for; the loop watches them
    (cadeloop: pidfd; asyncio 3.11: a thread per child; 3.12+: pidfd; uvloop: SIGCHLD)."""

    async def one() -> None:
        p = await asyncio.create_subprocess_exec("/bin/true")
        await p.wait()

    async def main() -> float:
        t0 = _now()
        for _ in range(n // width):
            await asyncio.gather(*(one() for _ in range(width)))
        return n / (_now() - t0)

    return loop.run_until_complete(main())


def subprocess_echo(loop: Loop, n: int = 400, size: int = 256 * 1024) -> float:
    """Children per second: each `cat` gets `size` bytes on stdin through communicate() and
    gives them back on stdout (three pipe transports and one child watch per child)."""
    payload = b"c" * size

    async def one() -> None:
        p = await asyncio.create_subprocess_exec("cat", stdin=asyncio.subprocess.PIPE,
                                                 stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate(payload)
        if len(out) != size:
            raise RuntimeError(f"cat gave back {len(out)} bytes of {size}")

    async def main() -> float:
        t0 = _now()
        for _ in range(n // 4):
            await asyncio.gather(*(one() for _ in range(4)))
        return n / (_now() - t0)

    return loop.run_until_complete(main())


def tcp_accept_churn_64(loop: Loop) -> float:
    return _accept_churn(loop, 20_000, 64)


def tcp_accept_churn_64_pyaccept(loop: Loop) -> float:
    return _accept_churn(loop, 20_000, 64, python_accept=True)


def sock_echo_1k(loop: Loop) -> float:
    return _sock_echo(loop, 1024, 50_000)


# --------------------------------------------------------------- sendfile


def _sock_sendfile(loop: Loop, python_path: bool, file_mib: int = 16, rounds: int = 256) -> float:
    """MiB per second: loop.sock_sendfile of a file over a socketpair, read by sock_recv_into on the same loop.

    python_path: on cadeloop, asyncio's own Python sendfile loop (os.sendfile
    from an add_writer callback, as before cadeloop's C++ one); on the other
    loops the same as the native path. uvloop 0.21 has no sock_sendfile
    (AbstractEventLoop's NotImplementedError): on uvloop both run
    _sendfile_by_hand, os.sendfile until EAGAIN then add_writer, which is what
    a program on uvloop would write.
    """
    import tempfile

    if python_path and type(loop).__module__.startswith("cadeloop"):
        import asyncio.unix_events as ue

        type(loop)._sock_sendfile_native = ue._UnixSelectorEventLoop._sock_sendfile_native  # type: ignore[attr-defined]
    size = file_mib << 20
    fd, path = tempfile.mkstemp(prefix="cadeloop-bench-sendfile-")
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1 << 20) * file_mib)

    async def main() -> float:
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        buf = bytearray(1 << 20)

        async def reader() -> None:
            got = 0
            while got < size:
                n = await loop.sock_recv_into(b, buf)
                if not n:
                    raise RuntimeError("peer closed early")
                got += n

        on_uvloop = type(loop).__module__.startswith("uvloop")
        with open(path, "rb") as f:
            t0 = _now()
            for _ in range(rounds):
                r = loop.create_task(reader())
                if on_uvloop:
                    sent = await _sendfile_by_hand(loop, a, f.fileno(), size)
                else:
                    sent = await loop.sock_sendfile(a, f, 0, None)
                await r
                if sent != size:
                    raise RuntimeError(f"sent {sent} of {size}")
            elapsed = _now() - t0
        a.close()
        b.close()
        return rounds * file_mib / elapsed

    try:
        return loop.run_until_complete(main())
    finally:
        os.unlink(path)


async def _sendfile_by_hand(loop: Loop, sock: socket.socket, fileno: int, size: int) -> int:
    """os.sendfile as far as the socket takes it, then wait for writable (add_writer); the bytes sent."""
    sent = 0
    while sent < size:
        try:
            sent += os.sendfile(sock.fileno(), fileno, sent, size - sent)
            continue
        except BlockingIOError:
            pass
        writable = loop.create_future()
        loop.add_writer(sock.fileno(), writable.set_result, None)
        try:
            await writable
        finally:
            loop.remove_writer(sock.fileno())
    return sent


def sock_sendfile_16m(loop: Loop) -> float:
    return _sock_sendfile(loop, python_path=False)


def sock_sendfile_16m_pypath(loop: Loop) -> float:
    return _sock_sendfile(loop, python_path=True)


WORKLOADS: dict[str, tuple[Callable[[Loop], float], str]] = {
    "call_soon_chain": (call_soon_chain, "callbacks/s"),
    "call_soon_burst": (call_soon_burst, "callbacks/s"),
    "timer_schedule_cancel": (timer_schedule_cancel, "timers/s"),
    "timer_fire": (timer_fire, "timers/s"),
    "sleep0_chain": (sleep0_chain, "sleeps/s"),
    "task_spawn": (task_spawn, "tasks/s"),
    "threadsafe_throughput": (threadsafe_throughput, "callbacks/s"),
    "future_chain": (future_chain, "futures/s"),
    "gather_fan_in": (gather_fan_in, "tasks/s"),
    "queue_ping_pong": (queue_ping_pong, "round trips/s"),
    "task_fib": (task_fib, "tasks/s"),
    "tcp_echo_1k_1conn": (tcp_echo_1k_1, "round trips/s"),
    "tcp_echo_1k_64conn": (tcp_echo_1k_64, "round trips/s"),
    "tcp_echo_64k_8conn": (tcp_echo_64k_8, "round trips/s"),
    "udp_echo_256b_8ep": (udp_echo_256_8, "round trips/s"),
    "pipe_ping_pong_1k": (pipe_ping_pong_1k, "round trips/s"),
    "subprocess_spawn_wait": (subprocess_spawn_wait, "children/s"),
    "subprocess_echo_256k": (subprocess_echo, "children/s"),
    # the accept loop (issue 15); _pyaccept: cadeloop with asyncio's Python accept path
    "tcp_accept_churn_64": (tcp_accept_churn_64, "connections/s"),
    "tcp_accept_churn_64_pyaccept": (tcp_accept_churn_64_pyaccept, "connections/s"),
    "sock_echo_1k": (sock_echo_1k, "round trips/s"),
    "sock_sendfile_16m": (sock_sendfile_16m, "MiB/s"),
    "sock_sendfile_16m_pypath": (sock_sendfile_16m_pypath, "MiB/s"),
}


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[2] not in WORKLOADS:
        print(__doc__, file=sys.stderr)
        print("workloads:", " ".join(WORKLOADS), file=sys.stderr)
        return 2
    loop_name, workload = sys.argv[1], sys.argv[2]
    fn, unit = WORKLOADS[workload]
    loop = make_loop(loop_name)
    asyncio.set_event_loop(loop)
    try:
        value = fn(loop)
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    (wall0, cpu0), (wall1, cpu1) = _readings[0], _readings[-1]
    ops = value * (wall1 - wall0)
    per_cpu = ops / (cpu1 - cpu0) if cpu1 > cpu0 else None
    print(json.dumps({"loop": loop_name, "workload": workload, "value": value, "unit": unit,
                      "per_cpu_second": per_cpu, "wall_s": wall1 - wall0, "cpu_s": cpu1 - cpu0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
