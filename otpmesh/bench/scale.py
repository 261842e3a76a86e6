"""What idle workers cost and how fast many start: ``python -m otpmesh.bench scale``.

Prints one JSON object, with the machine's load average (1 minute) before and after:

- ``memory``: 4 idle actors in 4 worker processes, after a full garbage collection in each (the
  worst case of an idle worker: a long-lived one has run one): the 4 workers' PSS, the fork
  server's and the controller's beside it, and what each worker wrote of its own (private dirty),
  the marginal cost of one more idle worker. The fork server preloads what it does by default
  (torch when installed) unless ``OTPMESH_PRELOAD`` says otherwise.
- ``imports``: what the fork server's preload costs, module by module, in a fresh interpreter:
  resident memory added and seconds (``python -X importtime`` gives the detail).
- ``start``: N worker processes started, an actor spawned in each and one broadcast answered,
  for each N of ``--sizes`` (1, 10, 100 by default; add 1000); and a no-op broadcast to
  ``--broadcast`` processes (100; median). These fork from a server that preloads nothing (as
  ``tests/test_thousand_idle.py`` does): a thousand workers need no torch, and fit in memory.
  Beside it, the floor on this machine: the same broadcast to as many bare trio echo servers
  (the call suite's baseline, each in a process and session of its own, forked
  from one interpreter), one frame to each and one reply from each, from one task.

On a shared machine the absolute figures say as much about the other jobs as about otpmesh:
read them beside the load.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import trio

import otpmesh

#: What the fork server imports, in the order it does: its own worker module, then the preload.
IMPORTS = ("msgpack", "trio", "otpmesh._runtime._worker", "numpy", "torch", "torch._dynamo")
SIZES = (1, 10, 100)
#: This module, by the name workers import it by (not ``__main__``).
MODULE = "otpmesh.bench.scale"
BROADCASTS = 200


class Idle(otpmesh.Actor):
    """An actor that does nothing until asked."""

    @otpmesh.endpoint
    async def noop(self) -> None:
        return None

    @otpmesh.endpoint
    def collect(self) -> int:
        return gc.collect()


def _idle() -> type[Idle]:
    """Idle, named by its module rather than as ``__main__.Idle`` under ``python -m``: a worker
    given a class of ``__main__`` runs the whole main file again to find it (every worker,
    imports and all), where a module the fork server preloaded costs it nothing."""
    module = importlib.import_module(MODULE)
    return module.Idle  # type: ignore[no-any-return]


def rollup(pid: int) -> dict[str, int]:
    """A process's memory in kB, from /proc/PID/smaps_rollup (Pss, Rss, Private_Dirty, ...)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith(":"):
                out[parts[0][:-1]] = int(parts[1])
    return out


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _mb(kb: float) -> float:
    return round(kb / 1024, 1)


async def memory(procs: int = 4) -> dict[str, Any]:
    """PSS of `procs` idle actors' processes, the fork server's and the controller's."""
    mesh_procs = await otpmesh.proc_mesh(procs=procs)
    try:
        mesh = await mesh_procs.spawn("idle", _idle())
        await mesh.collect()
        pids = mesh_procs.pids
        workers = [rollup(pid) for pid in pids]
        return {
            "preload": os.environ.get("OTPMESH_PRELOAD", "(default: torch)"),
            "workers": procs,
            "workers_pss_mb": _mb(sum(w["Pss"] for w in workers)),
            "fork_server_pss_mb": _mb(rollup(_parent(pids[0]))["Pss"]),
            "controller_pss_mb": _mb(rollup(os.getpid())["Pss"]),
            "worker_private_dirty_mb": _mb(statistics.median(w["Private_Dirty"] for w in workers)),
            "worker_rss_mb": _mb(statistics.median(w["Rss"] for w in workers)),
        }
    finally:
        await mesh_procs.stop()


#: Run in a fresh interpreter (``python -c``), so that nothing is imported before it measures.
_IMPORT_PROBE = """
import importlib, json, os, sys, time
def rss():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Rss:"))
before = rss()
rows = [{"module": "(python itself)", "rss_mb": round(before / 1024, 1), "s": 0.0}]
for name in sys.argv[1:]:
    began = time.perf_counter()
    importlib.import_module(name)
    took = time.perf_counter() - began
    after = rss()
    rows.append({"module": name, "rss_mb": round((after - before) / 1024, 1), "s": round(took, 2)})
    before = after
print(json.dumps(rows))
"""


def import_costs(modules: tuple[str, ...] = IMPORTS) -> list[dict[str, Any]]:
    """Each module's import in a fresh interpreter, in order: resident MB added, seconds."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, *modules], capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout))


async def start(sizes: tuple[int, ...] = SIZES, broadcast: int = 100) -> dict[str, Any]:
    """Seconds from asking for N processes to their actors' first broadcast answered, for each
    N of `sizes`; then a no-op broadcast to `broadcast` processes (median, ms)."""
    warm = await otpmesh.proc_mesh(procs=1)  # the fork server starts once, not in the figures
    await warm.stop()
    out: dict[str, Any] = {}
    for n in sizes:
        began = time.perf_counter()
        procs = await otpmesh.proc_mesh(procs=n)
        started = time.perf_counter() - began
        mesh = await procs.spawn("idle", _idle())
        await mesh.noop()
        out[f"procs_{n}_s"] = {
            "started": round(started, 3),
            "to_first_broadcast": round(time.perf_counter() - began, 3),
        }
        await procs.stop()
    procs = await otpmesh.proc_mesh(procs=broadcast)
    try:
        ms = await _broadcasts(await procs.spawn("idle", _idle()))
    finally:
        await procs.stop()
    bare = await _bare_broadcasts(broadcast)
    out[f"broadcast_{broadcast}_ms_p50"] = ms
    out[f"broadcast_{broadcast}_bare_trio_ms_p50"] = bare
    out[f"broadcast_{broadcast}_vs_bare"] = round(ms / bare, 2)
    return out


async def _broadcasts(mesh: Any) -> float:
    for _ in range(BROADCASTS // 10):
        await mesh.noop()
    samples = []
    for _ in range(BROADCASTS):
        began = time.perf_counter()
        await mesh.noop()
        samples.append(time.perf_counter() - began)
    return round(statistics.median(samples) * 1e3, 2)


async def _bare_broadcasts(n: int) -> float:
    """The median ms of a broadcast to `n` bare trio echo servers: one frame written to each,
    then one reply read from each (the floor an actor broadcast is measured against)."""
    from ._baseline import bare_frame, frame_complete

    frame = bare_frame(1, "noop")
    with _bare_servers(n) as socks:

        async def once() -> None:
            for sock in socks:
                sock.send(frame)
            for sock in socks:
                got = b""
                while not frame_complete(got):
                    try:
                        got += sock.recv(1 << 16)
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(sock)

        for _ in range(BROADCASTS // 10):
            await once()
        samples = []
        for _ in range(BROADCASTS):
            began = time.perf_counter()
            await once()
            samples.append(time.perf_counter() - began)
    return round(statistics.median(samples) * 1e3, 2)


@contextlib.contextmanager
def _bare_servers(n: int) -> Iterator[list[socket.socket]]:
    """`n` bare echo servers (``--bare-servers``), connected: their sockets, non-blocking."""
    prefix = f"otpmesh-bench-fanout-{os.getpid()}"
    argv = [sys.executable, "-m", MODULE, "--bare-servers", str(n), prefix]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    socks: list[socket.socket] = []
    try:
        assert server.stdout is not None
        for _ in range(n):
            server.stdout.readline()  # each says "ready" once it listens
        for i in range(n):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(sock)
            sock.connect(f"\0{prefix}-{i}")
            sock.setblocking(False)
        yield socks
    finally:
        for sock in socks:
            sock.close()  # each server's one connection ends: it exits
        server.kill()
        server.wait()


def _serve_bare(n: int, prefix: str) -> None:
    """``--bare-servers N PREFIX``: fork `n` bare echo servers from this interpreter (trio and
    msgpack imported once), each in a session of its own as a worker is; wait for them."""
    from ._baseline import echo_server

    children = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            os.setsid()
            try:
                trio.run(echo_server, f"{prefix}-{i}")
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench scale", description=__doc__)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(SIZES),
        metavar="N",
        help="worker processes to start, each in turn (default: 1 10 100; 1000 takes a while)",
    )
    parser.add_argument(
        "--imports",
        nargs="+",
        default=list(IMPORTS),
        metavar="MODULE",
        help=f"modules whose import is measured, in order (default: {' '.join(IMPORTS)})",
    )
    parser.add_argument(
        "--broadcast", type=int, default=100, metavar="N", help="processes broadcast to (100)"
    )
    parser.add_argument("--bare-servers", nargs=2, metavar=("N", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_servers:
        _serve_bare(int(args.bare_servers[0]), args.bare_servers[1])
        return
    load = [os.getloadavg()[0]]
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    result["memory"] = otpmesh.run(memory)
    result["imports"] = import_costs(tuple(args.imports))
    os.environ["OTPMESH_PRELOAD"] = MODULE  # its actor only; read when the next run starts
    result["start"] = otpmesh.run(start, tuple(args.sizes), args.broadcast)
    load.append(os.getloadavg()[0])
    result["machine"]["load_1min_before_after"] = [round(x, 2) for x in load]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
