"""Benchmark: broadcast over TCP to meshes on 1, 2 and 3 hosts, relayed by host agents or direct.

    python -m otpmesh.bench hosts            # namespaced hosts when run as root, else localhost

For each layout (hosts x worker processes per host; default 1x2 2x2 3x2, then 3x4 to double the
actors at the same host count) it reports the broadcast round trip (p50) and the controller's CPU
time per broadcast, twice: relayed through each host's agent (one send per host, the default)
and sent straight to every worker (one send per actor). The controller's CPU is its process time
over the timed calls. Prints one JSON list of rows;
progress goes to stderr. Also ``otpmesh bench hosts``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

import otpmesh
from otpmesh import launchers
from otpmesh._node._node import current_node
from otpmesh.testing import netns


class Echo(otpmesh.Actor):
    @otpmesh.endpoint
    def echo(self, x: int) -> int:
        return x


async def _measure(mesh: otpmesh.ActorMesh, n: int) -> tuple[float, float]:
    """(p50 round trip, controller CPU per call), both in microseconds."""
    for i in range(min(50, n)):
        await mesh.echo(i)
    samples = []
    cpu = time.process_time()
    for i in range(n):
        start = time.perf_counter()
        await mesh.echo(i)
        samples.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu
    return statistics.median(samples) * 1e6, cpu / n * 1e6


async def _one(hosts: int, procs: int, n: int, spaces: netns.NetnsHosts | None) -> dict[str, Any]:
    if spaces is None:
        cluster = otpmesh.cluster(launchers.Local(hosts=hosts))
    else:
        launcher = launchers.Local(
            hosts=hosts, prefixes=spaces.prefixes()[:hosts], listen=spaces.listen()[:hosts]
        )
        cluster = otpmesh.cluster(launcher, listen=spaces.controller_ip)
    async with cluster:
        pm = await otpmesh.proc_mesh(hosts=hosts, procs=procs)
        mesh = await pm.spawn("echo", Echo)
        relayed = await _measure(mesh, n)
        node = current_node()
        assert node is not None
        relays, node.relays = node.relays, {}  # the same mesh, one send per actor
        direct = await _measure(mesh, n)
        node.relays = relays
        await pm.stop()
    return {
        "transport": "netns" if spaces else "localhost",
        "hosts": hosts,
        "procs_per_host": procs,
        "actors": hosts * procs,
        "relayed_p50_us": round(relayed[0], 1),
        "relayed_cpu_us": round(relayed[1], 1),
        "direct_p50_us": round(direct[0], 1),
        "direct_cpu_us": round(direct[1], 1),
    }


#: Called as each layout starts: (its name, its number from 1, how many there are).
Progress = Callable[[str, int, int], None]
LAYOUTS = ["1x2", "2x2", "3x2", "3x4"]


def parse_layouts(texts: list[str]) -> list[tuple[int, int]]:
    """``["3x2"]`` -> ``[(3, 2)]``; ValueError for anything else."""
    layouts = []
    for text in texts:
        hosts, _, procs = text.partition("x")
        if not (hosts.isdigit() and procs.isdigit() and int(hosts) > 0 and int(procs) > 0):
            raise ValueError(f"a layout is HOSTSxPROCS, like 3x2, not {text!r}")
        layouts.append((int(hosts), int(procs)))
    return layouts


async def run(
    layouts: list[tuple[int, int]], n: int, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """One row per layout (see the module docstring)."""
    why = netns.unavailable()
    spaces = netns.make_hosts(max(h for h, _ in layouts)) if why is None else None
    transport = "tcp, netns hosts" if spaces else "tcp, localhost hosts"
    rows = []
    try:
        for i, (hosts, procs) in enumerate(layouts, 1):
            if progress is not None:
                progress(f"{hosts} host(s) x {procs} procs ({transport})", i, len(layouts))
            rows.append(await _one(hosts, procs, n, spaces))
    finally:
        if spaces is not None:
            spaces.remove()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench hosts", description=__doc__)
    parser.add_argument("--layouts", nargs="+", default=LAYOUTS, help="HOSTSxPROCS each")
    parser.add_argument("--broadcasts", type=int, default=500, help="timed per layout")
    args = parser.parse_args(argv)
    try:
        layouts = parse_layouts(args.layouts)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("OTPMESH_PRELOAD", "")  # these workers need no torch

    def progress(name: str, number: int, total: int) -> None:
        print(f"otpmesh.bench hosts [{number}/{total}]: {name}", file=sys.stderr, flush=True)

    result = trio.run(run, layouts, args.broadcasts, progress)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
