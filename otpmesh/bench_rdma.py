"""Tensor-channel transfer speed, actor to actor, beside the baselines measured in the same run:
a single-process ``copy_`` into a preallocated tensor, and a ``torch.distributed`` broadcast of
the same tensor (gloo on CPU) between two processes."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import otpmesh

MIB = 1 << 20


class Holder(otpmesh.Actor):
    """Owns one tensor per size, registered on the channel."""

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


class Taker(otpmesh.Actor):
    """Reads a buffer into a preallocated tensor, several times; reports the median GB/s."""

    @otpmesh.endpoint
    async def take(self, buf: Any, repeats: int) -> dict[str, Any]:
        import torch

        dst = torch.empty(buf.nbytes // 4, dtype=torch.float32)
        dst.zero_()  # touch the pages: measure the copy, not page faults
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            await buf.read_into(dst)
            times.append(time.perf_counter() - start)
        ok = bool(dst[0].item() == 1.0 and dst[-1].item() == 1.0)
        return {"seconds": statistics.median(times), "backend": buf.backend, "ok": ok}


def copy_baseline(nbytes: int, repeats: int) -> float:
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.zero_()
    dst.copy_(src)  # warm up (thread pool, caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


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
        queue.put(statistics.median(times))
    dist.destroy_process_group()


async def measure(
    sizes_mib: list[int],
    backends: list[str],
    repeats: int = 5,
    gloo: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (size, backend): GB/s, and the baselines for that size. `progress` hears
    each measurement as it starts: (what, its number from 1, how many)."""
    sizes = sorted(set(sizes_mib), key=sizes_mib.index)
    steps = len(backends) * len(sizes) + len(sizes) * (2 if gloo else 1)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(what, done, steps)

    rows = []
    for backend in backends:
        os.environ["OTPMESH_RDMA_BACKENDS"] = backend  # passed on to the workers forked next
        procs = await otpmesh.proc_mesh(procs=2)
        holders = await procs.spawn("holder", Holder)
        takers = await procs.spawn("taker", Taker)
        for mib in sizes:
            step(f"read {mib} MiB over {backend}")
            buf = await holders[0].offer(mib * MIB)
            got = await takers[1].take(buf, repeats)
            rows.append(
                {
                    "size_mib": mib,
                    "backend": got["backend"],
                    "ok": got["ok"],
                    "gb_per_s": round(mib * MIB / got["seconds"] / 1e9, 2),
                }
            )
        await procs.stop()
    os.environ.pop("OTPMESH_RDMA_BACKENDS", None)
    copy_speed = {}
    for mib in sizes:
        step(f"copy_ baseline, {mib} MiB")
        copy_speed[mib] = round(copy_baseline(mib * MIB, repeats), 2)
    for row in rows:
        row["copy_gb_per_s"] = copy_speed[row["size_mib"]]
        row["vs_copy"] = round(row["gb_per_s"] / row["copy_gb_per_s"], 2)
    if gloo:
        for mib in sizes:
            step(f"gloo broadcast baseline, {mib} MiB")
            speed = gloo_broadcast(mib * MIB, repeats)
            for row in rows:
                if row["size_mib"] == mib:
                    row["gloo_broadcast_gb_per_s"] = None if speed is None else round(speed, 2)
    return rows
