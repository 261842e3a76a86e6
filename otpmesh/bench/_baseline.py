"""The bare baseline every call figure is measured beside, and the timing helpers the suites
share: a trio echo server on an abstract Unix socket with otpmesh's framing (a 4-byte length
prefix, a msgpack payload) and nothing else, in a process of its own."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import trio

_LEN = struct.Struct(">I")

#: Calls per block of the interleaved baseline and unicast (rounds: the calls over this).
BLOCK = 200


def bare_frame(i: int, method: str = "echo") -> bytes:
    """The baseline's request: a length-prefixed msgpack call frame, as otpmesh's own."""
    out: bytes = msgpack.packb([0, i, "bench/0", method, [i], {}])
    return _LEN.pack(len(out)) + out


def frame_complete(buf: bytes) -> bool:
    """Whether `buf` holds one whole length-prefixed frame (the baseline reads one reply)."""
    return len(buf) >= 4 and len(buf) >= 4 + _LEN.unpack_from(buf)[0]


async def bare_round_trip(stream: trio.SocketStream, i: int) -> None:
    """One baseline round trip: a call frame written, its whole reply read."""
    await stream.send_all(bare_frame(i))
    got = b""
    while not frame_complete(got):
        got += await stream.receive_some(1 << 16)


async def echo_server(addr: str) -> None:
    """The bare baseline: a trio echo server on abstract Unix socket `addr` that answers each
    frame with a reply frame, nothing else (``python -m otpmesh.bench --echo-server ADDR``)."""
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind("\0" + addr)  # abstract socket: argv cannot carry the NUL
    listener.listen(1)
    print("ready", flush=True)
    sock, _ = await listener.accept()
    stream = trio.SocketStream(sock)
    buf = b""
    while data := await stream.receive_some(1 << 16):
        buf += data
        while frame_complete(buf):
            (size,) = _LEN.unpack_from(buf)
            msg = msgpack.unpackb(buf[4 : 4 + size])
            buf = buf[4 + size :]
            out = msgpack.packb([2, msg[1], msg[4]])
            await stream.send_all(_LEN.pack(len(out)) + out)


@contextlib.asynccontextmanager
async def bare_echo() -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """A bare echo server in another process, for the block: yields one round trip to it."""
    addr = f"otpmesh-bench-echo-{os.getpid()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "otpmesh.bench", "--echo-server", addr],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        stream = await trio.open_unix_socket("\0" + addr)

        async def one(i: int) -> None:
            await bare_round_trip(stream, i)

        await time_calls(one, 200)
        yield one
        await stream.aclose()
    finally:
        server.kill()
        server.wait()


async def time_calls(fn: Callable[[int], Awaitable[Any]], n: int) -> list[float]:
    """Seconds of each of `n` sequential awaits of ``fn(i)``."""
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await fn(i)
        samples.append(time.perf_counter() - start)
    return samples


async def interleaved(
    bare: Callable[[int], Awaitable[Any]], call: Callable[[int], Awaitable[Any]], calls: int
) -> tuple[list[float], list[float], list[float]]:
    """(bare samples, unicast samples, per-round ratios of their medians): alternating blocks,
    so a change in the machine's load between rounds weighs on both halves alike."""
    block = min(BLOCK, calls)
    bares: list[float] = []
    unicasts: list[float] = []
    ratios: list[float] = []
    for _ in range(max(1, calls // block)):
        b = await time_calls(bare, block)
        u = await time_calls(call, block)
        bares += b
        unicasts += u
        ratios.append(statistics.median(u) / statistics.median(b))
    return bares, unicasts, ratios


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(samples: list[float]) -> float:
    """The median of `samples` (seconds) in milliseconds, to 0.01."""
    return round(statistics.median(samples) * 1e3, 2)
