"""How fast a SIGKILLed replica is whole again: healed from a live peer (``Mesh(heal="peer")``)
beside restored from a checkpoint file (``torch.load`` in ``on_start``), in the same run.

    python -m otpmesh.bench heal [--trials 5] [--mb 100]

Three meshes of replicas, each holding ``--mb`` megabytes of float32 weights, changed after
start. Each trial SIGKILLs rank 1 of each mesh in turn and times, in the controller, from the
SIGKILL to the restarted replica's first reply (one small call, which waits for the restart):

- peer: ``heal="peer"`` (4 replicas): the new one takes the weights from rank 0 over the tensor
  channel before it serves;
- checkpoint: no heal (2 replicas): ``on_start`` loads the file rank 0 wrote with ``torch.save``
  (from the page cache: it was just written; a cold read from disk or a network file system
  costs more). Writing it is timed too (``save``): the price paid before every failure;
- constructor: no heal, nothing loaded (2 replicas): the restart alone (detect the exit, fork a
  fresh process, construct), which the other two include.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import otpmesh
from otpmesh import Mesh, Supervisor

from .pgroup import table

KINDS = ("peer", "checkpoint", "constructor")


class Weights(otpmesh.Actor):
    """A replica's weights; restored from `checkpoint` in on_start when that file exists."""

    def __init__(self, numel: int, checkpoint: str = "") -> None:
        import torch

        self.weights = torch.zeros(numel)
        self.checkpoint = checkpoint

    async def on_start(self) -> None:
        import torch

        if self.checkpoint and os.path.exists(self.checkpoint):
            self.weights = torch.load(self.checkpoint)

    @otpmesh.endpoint
    def state(self) -> dict[str, Any]:
        return {"weights": self.weights}

    async def load_state(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"]

    @otpmesh.endpoint
    def fill(self, value: float) -> None:
        self.weights.fill_(value)

    @otpmesh.endpoint
    def save(self) -> float:
        """Write the checkpoint (aside, then renamed); the seconds it took."""
        import torch

        start = time.perf_counter()
        torch.save(self.weights, self.checkpoint + ".tmp")
        os.replace(self.checkpoint + ".tmp", self.checkpoint)
        return time.perf_counter() - start

    @otpmesh.endpoint
    def last(self) -> float:
        return float(self.weights[-1])


def tree(numel: int, checkpoint: str, trials: int) -> Supervisor:
    def mesh(kind: str, size: int, **fields: Any) -> Mesh:
        return Mesh(kind, Weights, shape={"procs": size}, intensity=trials + 1, period=3600.0,
                    **fields)  # fmt: skip

    return Supervisor(
        "bench",
        children=[
            mesh("peer", 4, args=(numel,), heal="peer"),
            mesh("checkpoint", 2, args=(numel, checkpoint)),
            mesh("constructor", 2, args=(numel,)),
        ],
    )


async def run(trials: int, megabytes: int) -> list[dict[str, float]]:
    numel = megabytes * (1 << 20) // 4
    results = []
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = os.path.join(directory, "weights.pt")
        async with otpmesh.start(tree(numel, checkpoint, trials)) as app:
            for trial in range(1, trials + 1):
                result = {}
                for kind in KINDS:
                    mesh = app.mesh(f"bench/{kind}")
                    await mesh.fill(float(trial))
                    if kind == "checkpoint":
                        result["save"] = await mesh[0].save()
                    start = time.perf_counter()
                    await otpmesh.chaos.kill(app, f"bench/{kind}/1")
                    value = await mesh[1].last()  # waits for the restart (and the heal)
                    result[kind] = time.perf_counter() - start
                    expected = 0.0 if kind == "constructor" else float(trial)
                    if value != expected:
                        raise RuntimeError(f"{kind}: the restarted replica has {value}")
                    await app.settled()
                results.append(result)
    return results


def report(results: list[dict[str, float]]) -> str:
    return table(results, (*KINDS, "save"), heading="restore")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench heal",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mb", type=int, default=100, help="weights per replica, in MB")
    args = parser.parse_args(argv)
    os.environ.setdefault("OTPMESH_PRELOAD", "torch")
    results = otpmesh.run(run, args.trials, args.mb)
    print(f"SIGKILL of 1 replica holding {args.mb} MB -> its first reply ({len(results)} trials)")
    print(report(results))


if __name__ == "__main__":
    main()
