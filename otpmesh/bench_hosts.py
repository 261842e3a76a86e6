"""Benchmark: broadcast over TCP to meshes on 1, 2 and 3 hosts, relayed by host agents or direct.

    python -m otpmesh.bench_hosts            # namespaced hosts when run as root, else localhost

For each host count (2 worker processes per host) it reports the broadcast round trip (p50) and
the controller's CPU time per broadcast, twice: with the broadcast relayed through each host's
agent (one send per host, the default), and sent straight to every worker (one send per actor).
The controller's CPU is process time (all its threads) over the timed calls. Prints one JSON
object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import trio

import otpmesh
from otpmesh import launchers
from otpmesh._node import current_node
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
        cluster = otpmesh.cluster(launcher, listen=netns.CONTROLLER_IP)
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
        "hosts": hosts,
        "actors": hosts * procs,
        "relayed_p50_us": round(relayed[0], 1),
        "relayed_cpu_us": round(relayed[1], 1),
        "direct_p50_us": round(direct[0], 1),
        "direct_cpu_us": round(direct[1], 1),
    }


async def run(counts: list[int], procs: int, n: int) -> dict[str, Any]:
    why = netns.unavailable()
    spaces = netns.make_hosts(max(counts)) if why is None else None
    rows = []
    try:
        for hosts in counts:
            print(f"bench_hosts: {hosts} host(s) x {procs} procs...", file=sys.stderr, flush=True)
            rows.append(await _one(hosts, procs, n, spaces))
    finally:
        if spaces is not None:
            spaces.remove()
    return {
        "transport": "tcp between network namespaces" if spaces else f"tcp on localhost ({why})",
        "calls": n,
        "procs_per_host": procs,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench_hosts", description=__doc__)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--procs", type=int, default=2, help="worker processes per host")
    parser.add_argument("--calls", type=int, default=500, help="broadcasts timed per setting")
    args = parser.parse_args(argv)
    result = trio.run(run, args.hosts, args.procs, args.calls)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
