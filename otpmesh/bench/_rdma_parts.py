"""What the rdma suite (``otpmesh.bench.rdma``) measures with: the actors that hold, send and
take tensors, and the baselines beside them (``copy_``, ``clone``, a gloo broadcast, plain
sockets between two namespaced hosts)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import otpmesh

MIB = 1 << 20


#: Calls before the measured ones: they open connections and fill the sender's pool of warm
#: snapshot files (``otpmesh/rdma/_pool.py``), which settles at 2-3 files when each receiver
#: drops a value by the next call. ``first`` is the very first call's time (new files).
WARMUP = 3


def best_of(times: list[float]) -> dict[str, float]:
    """The best and the median of `times` (seconds)."""
    return {"best": min(times), "median": statistics.median(times)}


class Holder(otpmesh.Actor):
    """Owns one tensor per size, registered on the channel; sends tensors to other actors."""

    def __init__(self) -> None:
        self.keep: list[Any] = []

    @otpmesh.endpoint
    def offer(self, nbytes: int) -> Any:
        import torch

        from otpmesh.rdma import RDMABuffer

        t = torch.ones(nbytes // 4, dtype=torch.float32)
        buf = RDMABuffer(t)
        self.keep.append((t, buf))
        return buf

    @otpmesh.endpoint
    async def send(self, peers: Any, nbytes: int, repeats: int, what: str) -> dict[str, Any]:
        """Time `repeats` calls of `peers` (an actor or a mesh) that move `nbytes` one way."""
        import torch

        t = torch.ones(nbytes // 4, dtype=torch.float32)
        times, ok = [], True
        for _ in range(WARMUP + repeats):
            start = time.perf_counter()
            if what == "result":
                got = await peers.make(nbytes)
                ok = ok and bool(got[0].item() == 1.0 and got[-1].item() == 1.0)
            else:
                seen = await peers.take(t, what == "argument+touch")
                ok = ok and (seen if isinstance(seen, bool) else all(seen))
            times.append(time.perf_counter() - start)
        return {**best_of(times[WARMUP:]), "first": times[0], "ok": ok}


class Taker(otpmesh.Actor):
    """Receives tensors (arguments, results) and reads buffers into a preallocated tensor."""

    def __init__(self) -> None:
        self.out: Any = None

    @otpmesh.endpoint
    def take(self, t: Any, touch: bool) -> bool:
        ok = bool(t[0].item() == 1.0 and t[-1].item() == 1.0)
        if touch:  # one byte per page: the cost of first use, not of arithmetic
            t.view(-1).view(dtype=_uint8())[::4096].sum()
        return ok

    @otpmesh.endpoint
    def make(self, nbytes: int) -> Any:
        import torch

        if self.out is None or self.out.numel() * 4 != nbytes:
            self.out = torch.ones(nbytes // 4, dtype=torch.float32)
        return self.out

    @otpmesh.endpoint
    async def read(self, buf: Any, repeats: int) -> dict[str, Any]:
        import torch

        dst = torch.empty(buf.nbytes // 4, dtype=torch.float32)
        dst.zero_()  # touch the pages: measure the copy, not page faults
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            await buf.read_into(dst)
            times.append(time.perf_counter() - start)
        ok = bool(dst[0].item() == 1.0 and dst[-1].item() == 1.0)
        return {**best_of(times[1:]), "backend": buf.backend, "ok": ok}

    @otpmesh.endpoint
    async def write(self, buf: Any, repeats: int) -> dict[str, Any]:
        import torch

        src = torch.ones(buf.nbytes // 4, dtype=torch.float32)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            await buf.write_from(src)
            times.append(time.perf_counter() - start)
        return {**best_of(times[1:]), "backend": buf.backend, "ok": True}


def _uint8() -> Any:
    import torch

    return torch.uint8


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm up (thread pool, caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def baselines(nbytes: int, repeats: int) -> dict[str, float]:
    """GB/s of ``copy_`` into a warm tensor (with torch's threads, and with one), and of
    ``clone`` (allocate, first touch, copy)."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.zero_()
    threads = torch.get_num_threads()
    copy = nbytes / _timed(lambda: dst.copy_(src), repeats) / 1e9
    torch.set_num_threads(1)
    try:
        copy1 = nbytes / _timed(lambda: dst.copy_(src), repeats) / 1e9
    finally:
        torch.set_num_threads(threads)
    return {"copy": copy, "copy1": copy1, "clone": nbytes / _timed(src.clone, repeats) / 1e9}


def gloo_broadcast(nbytes: int, repeats: int) -> float | None:
    """GB/s of a 2-process torch.distributed (gloo) broadcast of the same size."""
    import torch.multiprocessing as mp

    try:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        port = 29500 + os.getpid() % 1000
        procs = [
            ctx.Process(target=_gloo_rank, args=(r, port, nbytes, repeats, queue)) for r in range(2)
        ]
        for p in procs:
            p.start()
        seconds = queue.get()
        for p in procs:
            p.join(60)
        return float(nbytes / seconds / 1e9)
    except Exception:
        return None


def _gloo_rank(rank: int, port: int, nbytes: int, repeats: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(nbytes // 4) if rank == 0 else torch.zeros(nbytes // 4)
    dist.broadcast(t, 0)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(t, 0)
        times.append(time.perf_counter() - start)
    if rank == 1:
        queue.put(min(times))
    dist.destroy_process_group()


def result_row(
    mib: int, what: str, backend: str, got: dict[str, Any], nbytes: int | None = None
) -> dict[str, Any]:
    """One result row: `mib` names the size the row belongs to (its baselines), `nbytes` what
    was moved when that differs (the inline row's tensor, just below the threshold)."""
    moved = mib * MIB if nbytes is None else nbytes
    return {
        "size_mib": mib,
        **({} if nbytes is None else {"bytes": nbytes}),
        "what": what,
        "backend": got.get("backend", backend),
        "ok": got["ok"],
        "seconds": round(got["best"], 5),
        "gb_per_s": round(moved / got["best"] / 1e9, 2),
        "median_gb_per_s": round(moved / got["median"] / 1e9, 2),
        **({"first_gb_per_s": round(moved / got["first"] / 1e9, 2)} if "first" in got else {}),
    }


_RANGE = struct.Struct(">QQ")


def _raw_serve(host: str, nbytes: int) -> None:
    """Send a slice of `nbytes` of ones for each range a connection asks for (the raw-socket
    baseline's server); prints its port, serves until killed."""
    src = memoryview(bytearray(b"\x01") * nbytes)
    with socket.create_server((host, 0)) as listener:
        print(listener.getsockname()[1], flush=True)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_raw_send, args=(conn, src), daemon=True).start()


def _raw_send(conn: socket.socket, src: memoryview) -> None:
    with conn:
        while asked := conn.recv(_RANGE.size, socket.MSG_WAITALL):
            start, size = _RANGE.unpack(asked)
            conn.sendall(src[start : start + size])


def _raw_read(host: str, port: int, nbytes: int, repeats: int, streams: int) -> None:
    """Print (JSON) the best and median seconds of reading `nbytes` from ``_raw_serve`` into a
    warm buffer, as `streams` slices at once."""
    dst = memoryview(bytearray(b"\x00") * nbytes)
    step = nbytes // streams
    conns = [socket.create_connection((host, port)) for _ in range(streams)]

    def one(conn: socket.socket, start: int) -> None:
        conn.sendall(_RANGE.pack(start, step))
        view, done = dst[start : start + step], 0
        while done < step:
            got = conn.recv_into(view[done:])
            if not got:
                raise ConnectionError("the raw-socket server went away")
            done += got

    times = []
    for _ in range(repeats + 1):  # the first warms up the connections
        begin = time.perf_counter()
        threads = [threading.Thread(target=one, args=(c, i * step)) for i, c in enumerate(conns)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        times.append(time.perf_counter() - begin)
    print(json.dumps(best_of(times[1:])))


#: Runs ``_raw_serve`` or ``_raw_read`` in a namespaced host: a host, then numbers.
_RAW = (
    "import sys; from otpmesh.bench._rdma_parts import {0}; "
    "{0}(sys.argv[1], *map(int, sys.argv[2:]))"
)


def raw_socket(spaces: Any, nbytes: int, repeats: int, streams: int) -> float:
    """GB/s of plain sockets from host 0 to host 1 of `spaces` (``_raw_read``'s best)."""
    host = spaces.ip(0)
    serve = [*spaces.prefixes()[0], sys.executable, "-c", _RAW.format("_raw_serve")]
    server = subprocess.Popen([*serve, host, str(nbytes)], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()  # type: ignore[union-attr]
        read = [*spaces.prefixes()[1], sys.executable, "-c", _RAW.format("_raw_read")]
        numbers = [str(n) for n in (nbytes, repeats, streams)]
        out = subprocess.run(
            [*read, host, port, *numbers], capture_output=True, text=True, timeout=300
        )
        out.check_returncode()
        return float(nbytes / json.loads(out.stdout)["best"] / 1e9)
    finally:
        server.kill()
        server.wait()
