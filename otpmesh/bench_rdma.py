"""Tensor-channel transfer speed, actor to actor, beside the baselines measured in the same run:
a single-process ``copy_`` into a warm tensor, ``clone`` (allocate and copy), and a
``torch.distributed`` broadcast of the same tensor (gloo on CPU) between two processes.

What is measured, per size and backend (each figure the best of `repeats`, after ``WARMUP``
calls, in GB/s of one tensor; ``seconds`` is that best time; for calls, ``first_gb_per_s`` is
the very first one, which copies into new memory files rather than the pool's warm ones):

- ``read_into``: ``await buf.read_into(t)`` of an ``RDMABuffer`` into a preallocated tensor;
- ``argument``: an endpoint call whose argument is the tensor (the callee does not touch it);
- ``argument+touch``: the same, the callee reading one byte of every page (what a mapped
  argument costs once it is used);
- ``result``: an endpoint call whose result is the tensor;
- ``broadcast x4``: one call, the tensor as its argument, to 4 actors in 4 processes (wall time);
- ``argument inline`` (the smallest size only): a tensor 4 bytes below the channel threshold,
  which travels in the message itself (its row's ``bytes`` say so; with ``--sizes 1`` compare
  its ``seconds`` with the 1 MiB ``argument`` row's: the channel against inline at the threshold).

Each row says whether its workers were ``sandboxed`` (``otpmesh/_core/_sandbox.py``). The
``shm`` backend's rows are measured with ``OTPMESH_SANDBOX=0``: it copies between two workers
only outside their sandboxes. ``--backends shm,tcp`` measures what a sandboxed app gets.

``measure_controller`` (``--controller``) measures an argument, a result, ``read_into`` and
``write_from`` between the controller and one worker: the controller is not dumpable, so these
are the paths that pass descriptors or have the controller copy (docs/rdma.md).

``measure_hosts`` measures ``read_into``, ``argument`` and ``result`` between two hosts made as
network namespaces (``otpmesh.testing.netns``; needs root), where the only backend that reaches
is ``tcp``: ``python -m otpmesh.bench_rdma --between-hosts``; beside them, what plain sockets
move between the same two namespaces in one stream and in two (``raw_socket_gb_per_s``,
``raw_socket_2_streams_gb_per_s``: a ``recv_into`` a warm buffer, connections kept open).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import otpmesh
from otpmesh._core._sandbox import ENV as SANDBOX_ENV
from otpmesh._core._sandbox import unavailable as sandbox_unavailable
from otpmesh._core._sandbox import wanted as sandbox_wanted

MIB = 1 << 20
BROADCAST = 4


#: Calls before the measured ones: they open connections and fill the sender's pool of warm
#: snapshot files (``otpmesh/rdma/_pool.py``), which settles at 2-3 files when each receiver
#: drops a value by the next call. ``first`` is the very first call's time (new files).
WARMUP = 3


def _best(times: list[float]) -> dict[str, float]:
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
        return {**_best(times[WARMUP:]), "first": times[0], "ok": ok}


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
        return {**_best(times[1:]), "backend": buf.backend, "ok": ok}

    @otpmesh.endpoint
    async def write(self, buf: Any, repeats: int) -> dict[str, Any]:
        import torch

        src = torch.ones(buf.nbytes // 4, dtype=torch.float32)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            await buf.write_from(src)
            times.append(time.perf_counter() - start)
        return {**_best(times[1:]), "backend": buf.backend, "ok": True}


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


WHAT = ("read_into", "argument", "argument+touch", "result", f"broadcast x{BROADCAST}")


async def measure(
    sizes_mib: list[int],
    backends: list[str],
    repeats: int = 5,
    gloo: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    what: Sequence[str] = (*WHAT, "argument inline"),
) -> list[dict[str, Any]]:
    """One row per (size, backend, what is measured; see the module's docstring): GB/s, and the
    baselines for that size. `what`: the measurements to make (default: all). `progress` hears
    each measurement as it starts: (what, its number from 1, how many)."""
    from otpmesh._wire._tensors import CHANNEL_THRESHOLD

    unknown = [w for w in what if w not in (*WHAT, "argument inline")]
    if unknown:
        known = ", ".join((*WHAT, "argument inline"))
        raise ValueError(f"unknown measurement {unknown[0]!r}; known: {known}")
    sizes = sorted(set(sizes_mib), key=sizes_mib.index)
    chosen = [w for w in WHAT if w in what]
    inline = "argument inline" in what and min(sizes) * MIB >= CHANNEL_THRESHOLD
    steps = len(backends) * (len(sizes) * len(chosen) + inline) + len(sizes) * (2 if gloo else 1)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(what, done, steps)

    rows = []
    sandbox = os.environ.get(SANDBOX_ENV)
    for backend in backends:
        os.environ["OTPMESH_RDMA_BACKENDS"] = backend  # passed on to the workers forked next
        # shm alone copies between workers only outside their sandboxes (docs/security.md);
        # other backends run as the app would.
        if backend == "shm":
            os.environ[SANDBOX_ENV] = "0"
        elif sandbox is None:
            os.environ.pop(SANDBOX_ENV, None)
        else:
            os.environ[SANDBOX_ENV] = sandbox
        sandboxed = sandbox_wanted() and sandbox_unavailable() is None
        procs = await otpmesh.proc_mesh(procs=1 + (BROADCAST if WHAT[-1] in chosen else 1))
        holder = (await procs.spawn("holder", Holder))[0]
        takers = await procs.spawn("taker", Taker)
        one, group = takers[1], takers.slice(procs=slice(1, None))
        for mib in sizes:
            nbytes = mib * MIB
            for kind in chosen:
                step(f"{kind}, {mib} MiB over {backend}")
                if kind == "read_into":
                    got = await one.read(await holder.offer(nbytes), repeats)
                else:
                    peers = group if kind.startswith("broadcast") else one
                    got = await holder.send(peers, nbytes, repeats, kind)
                rows.append({**_row(mib, kind, backend, got), "sandboxed": sandboxed})
        if inline:
            step(f"argument inline, {min(sizes)} MiB over {backend}")
            nbytes = CHANNEL_THRESHOLD - 4
            got = await holder.send(one, nbytes, repeats, "argument")
            row = _row(min(sizes), "argument inline", backend, got, nbytes)
            rows.append({**row, "sandboxed": sandboxed})
        await procs.stop()
    os.environ.pop("OTPMESH_RDMA_BACKENDS", None)
    if sandbox is None:
        os.environ.pop(SANDBOX_ENV, None)
    else:
        os.environ[SANDBOX_ENV] = sandbox
    speeds = {}
    for mib in sizes:
        step(f"copy_ and clone baselines, {mib} MiB")
        speeds[mib] = baselines(mib * MIB, repeats)
    for row in rows:
        base = speeds[row["size_mib"]]
        row["copy_gb_per_s"] = round(base["copy"], 2)
        row["copy_1thread_gb_per_s"] = round(base["copy1"], 2)
        row["clone_gb_per_s"] = round(base["clone"], 2)
        row["vs_copy"] = round(row["gb_per_s"] / base["copy"], 2)
    if gloo:
        for mib in sizes:
            step(f"gloo broadcast baseline, {mib} MiB")
            speed = gloo_broadcast(mib * MIB, repeats)
            for row in rows:
                if row["size_mib"] == mib:
                    row["gloo_broadcast_gb_per_s"] = None if speed is None else round(speed, 2)
    return rows


def _row(
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


HOSTS_WHAT = ("read_into", "argument", "result")
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
    print(json.dumps(_best(times[1:])))


#: Runs ``_raw_serve`` or ``_raw_read`` in a namespaced host: a host, then numbers.
_RAW = "import sys; from otpmesh.bench_rdma import {0}; {0}(sys.argv[1], *map(int, sys.argv[2:]))"


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


async def measure_hosts(size_mib: int = 256, repeats: int = 5) -> list[dict[str, Any]]:
    """One row per measurement in ``HOSTS_WHAT``: a holder on one namespaced host, a taker on
    another (so ``tcp``, over a veth pair and a bridge), beside ``copy_`` and ``clone`` in this
    process. RuntimeError where namespaced hosts cannot be made (not root, no iproute2)."""
    from otpmesh import launchers
    from otpmesh.testing import netns

    why = netns.unavailable()
    if why is not None:
        raise RuntimeError(f"cannot measure between namespaced hosts: {why}")
    nbytes = size_mib * MIB
    rows = []
    spaces = netns.make_hosts(2, kind="r")
    try:
        launcher = launchers.Local(hosts=2, prefixes=spaces.prefixes(), listen=spaces.listen())
        async with otpmesh.cluster(launcher, listen=spaces.controller_ip):
            procs = await otpmesh.proc_mesh(hosts=2, procs=1)
            holder = (await procs.spawn("holder", Holder))[0]
            taker = (await procs.spawn("taker", Taker))[1]
            for kind in HOSTS_WHAT:
                if kind == "read_into":
                    got = await taker.read(await holder.offer(nbytes), repeats)
                else:
                    got = await holder.send(taker, nbytes, repeats, kind)
                rows.append({**_row(size_mib, kind, "tcp", got), "between": "netns hosts"})
            await procs.stop()
        raw = [raw_socket(spaces, nbytes, repeats, streams) for streams in (1, 2)]
    finally:
        spaces.remove()
    base = baselines(nbytes, repeats)
    for row in rows:
        row["raw_socket_gb_per_s"] = round(raw[0], 2)
        row["raw_socket_2_streams_gb_per_s"] = round(raw[1], 2)
        row["copy_gb_per_s"] = round(base["copy"], 2)
        row["copy_1thread_gb_per_s"] = round(base["copy1"], 2)
        row["clone_gb_per_s"] = round(base["clone"], 2)
        row["vs_copy"] = round(row["gb_per_s"] / base["copy"], 2)
    return rows


CONTROLLER_WHAT = ("argument", "result", "read_into", "write_from")


async def measure_controller(size_mib: int = 256, repeats: int = 5) -> list[dict[str, Any]]:
    """One row per measurement in ``CONTROLLER_WHAT`` between this process, the controller (not
    dumpable: a worker cannot read it, docs/security.md), and one worker: an argument to it, a
    result from it, and the worker's ``read_into`` / ``write_from`` of an ``RDMABuffer`` the
    controller registered (the controller copies for it, docs/rdma.md)."""
    import torch

    from otpmesh.rdma import RDMABuffer

    nbytes = size_mib * MIB
    procs = await otpmesh.proc_mesh(procs=1)
    taker = (await procs.spawn("taker", Taker))[0]
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    rows = []
    for kind in CONTROLLER_WHAT:
        if kind in ("read_into", "write_from"):
            buf = RDMABuffer(t)
            got = await (taker.read if kind == "read_into" else taker.write)(buf, repeats)
            buf.drop()
        else:
            times, ok = [], True
            for _ in range(WARMUP + repeats):
                start = time.perf_counter()
                if kind == "result":
                    back = await taker.make(nbytes)
                    ok = ok and bool(back[0].item() == 1.0 and back[-1].item() == 1.0)
                else:
                    ok = ok and await taker.take(t, False)
                times.append(time.perf_counter() - start)
            got = {**_best(times[WARMUP:]), "first": times[0], "ok": ok}
        rows.append({**_row(size_mib, kind, "shm", got), "between": "controller and worker"})
    await procs.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m otpmesh.bench_rdma``: the same host (``otpmesh bench rdma`` has the options),
    or ``--between-hosts``: two namespaced hosts over tcp. Rows as JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench_rdma")
    parser.add_argument("--between-hosts", action="store_true", help="two netns hosts (root)")
    parser.add_argument(
        "--controller", action="store_true", help="between the controller and one worker"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256], help="MiB (default 256)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--backends", nargs="+", default=["shm"], help="each an OTPMESH_RDMA_BACKENDS value"
    )
    args = parser.parse_args(argv)

    async def run() -> list[dict[str, Any]]:
        if args.between_hosts:
            return [r for mib in args.sizes for r in await measure_hosts(mib, args.repeats)]
        if args.controller:
            return [r for mib in args.sizes for r in await measure_controller(mib, args.repeats)]
        return await measure(args.sizes, args.backends, args.repeats, gloo=False)

    for row in otpmesh.run(run):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
