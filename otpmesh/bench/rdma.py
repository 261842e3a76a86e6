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
is ``tcp``: ``python -m otpmesh.bench rdma --between-hosts``; beside them, what plain sockets
move between the same two namespaces in one stream and in two (``raw_socket_gb_per_s``,
``raw_socket_2_streams_gb_per_s``: a ``recv_into`` a warm buffer, connections kept open).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import otpmesh
from otpmesh._core._sandbox import ENV as SANDBOX_ENV
from otpmesh._core._sandbox import unavailable as sandbox_unavailable
from otpmesh._core._sandbox import wanted as sandbox_wanted

from ._rdma_parts import (
    MIB,
    WARMUP,
    Holder,
    Taker,
    baselines,
    best_of,
    gloo_broadcast,
    raw_socket,
    result_row,
)

BROADCAST = 4


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
                rows.append({**result_row(mib, kind, backend, got), "sandboxed": sandboxed})
        if inline:
            step(f"argument inline, {min(sizes)} MiB over {backend}")
            nbytes = CHANNEL_THRESHOLD - 4
            got = await holder.send(one, nbytes, repeats, "argument")
            row = result_row(min(sizes), "argument inline", backend, got, nbytes)
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


HOSTS_WHAT = ("read_into", "argument", "result")


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
                rows.append({**result_row(size_mib, kind, "tcp", got), "between": "netns hosts"})
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
            got = {**best_of(times[WARMUP:]), "first": times[0], "ok": ok}
        rows.append({**result_row(size_mib, kind, "shm", got), "between": "controller and worker"})
    await procs.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m otpmesh.bench rdma``: the same host (``otpmesh bench rdma`` has the options),
    or ``--between-hosts``: two namespaced hosts over tcp. Rows as JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench rdma")
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
