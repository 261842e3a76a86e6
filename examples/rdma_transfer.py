"""RDMA transfer timing (the seed's exercise 4): register a tensor in one actor, pass the handle,
read it from another, and time each size, beside a same-process copy_ and a torch.distributed
(gloo) broadcast measured in the same run.

    python examples/rdma_transfer.py [--sizes 1 16 64 256] [--backends shm tcp]
                                     [--what read_into argument result "broadcast x4"] [--json]

What is timed (otpmesh.bench.rdma): an explicit ``read_into`` a preallocated tensor, a tensor
passed as an endpoint argument and returned as a result (the channel carries both, no import
needed), and the same argument broadcast to 4 actors.
"""

from __future__ import annotations

import argparse
import json

import torch

import otpmesh
from otpmesh.bench.rdma import WHAT, measure
from otpmesh.rdma import RDMABuffer


class Learner(otpmesh.Actor):
    def __init__(self) -> None:
        self.weights = torch.arange(1024, dtype=torch.float32)

    @otpmesh.endpoint
    def share(self) -> RDMABuffer:
        return RDMABuffer(self.weights)  # a small handle; the bytes stay here

    @otpmesh.endpoint
    def weights_sum(self) -> float:
        return float(self.weights.sum())


class Rollout(otpmesh.Actor):
    @otpmesh.endpoint
    async def sync(self, handle: RDMABuffer) -> str:
        local = torch.empty(1024)
        await handle.read_into(local)  # one-sided: the learner's code does not run
        local *= 2
        await handle.write_from(local)  # and back
        return f"read and wrote {handle.nbytes} bytes over {handle.backend}"


async def main(sizes: list[int], backends: list[str], what: list[str], as_json: bool) -> None:
    procs = await otpmesh.proc_mesh(procs=2)
    learner = (await procs.spawn("learner", Learner))[0]
    rollout = (await procs.spawn("rollout", Rollout))[1]
    print(await rollout.sync(await learner.share()))
    print(f"learner's weights now sum to {await learner.weights_sum():.0f} (was 523776)")
    await procs.stop()

    rows = await measure(sizes, backends, what=what)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    header = ("size", "backend", "what", "GB/s", "copy_ GB/s", "ratio", "gloo GB/s")
    print("\n{:>8} {:>8} {:>14} {:>7} {:>11} {:>6} {:>10}".format(*header))
    for r in rows:
        gloo = r.get("gloo_broadcast_gb_per_s")
        print(
            f"{r['size_mib']:>5} MiB {r['backend']:>8} {r['what'].replace(' ', '_'):>14} "
            f"{r['gb_per_s']:>7} {r['copy_gb_per_s']:>11} {r['vs_copy']:>6} "
            f"{gloo if gloo is not None else '-':>10}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256], help="MiB")
    parser.add_argument("--backends", nargs="+", default=otpmesh.rdma.backends())
    parser.add_argument("--what", nargs="+", default=list(WHAT), choices=WHAT)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    otpmesh.run(main, args.sizes, args.backends, args.what, args.json)
