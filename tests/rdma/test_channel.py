"""Large tensors in ordinary calls travel over the tensor channel without the user asking."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import trio

import otpmesh
from otpmesh._node._node import current_node
from tests.actors import Echo, TensorOwner
from tests.conftest import run_program, run_trio

BIG = 1 << 22  # 16 MiB of float32, above the 1 MiB threshold


def _registered_here() -> int:
    node = current_node()
    registry = None if node is None else node.channel._registry  # type: ignore[union-attr]
    return 0 if registry is None else len(registry.buffers)


def test_large_arguments_and_results_round_trip_through_the_channel() -> None:
    os.environ.pop("OTPMESH_PRELOAD", None)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            owners = await procs.spawn("o", TensorOwner)
            big = torch.randn(BIG)
            back = await mesh[1].echo({"weights": big, "step": (3, torch.ones(2))})
            assert torch.equal(back["weights"], big) and back["step"][0] == 3
            everyone = await mesh.echo(big)  # a ValueMesh of large tensors
            assert all(torch.equal(t, big) for t in everyone)
            # actor to actor, in another process and in the same one
            other = await mesh[0].call_peer(mesh[1], big)
            assert torch.equal(other["value"], big)
            assert _registered_here() == 0  # temporary buffers were dropped after the reads
            # a reader's drop reaches a worker on a connection of its own: give it a moment
            with trio.fail_after(10):
                while (await owners.registered()).values() != [0, 0]:
                    await trio.sleep(0.05)

    run_trio(body, timeout=150)


def test_small_tensors_stay_inline() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            small = torch.arange(10)
            assert torch.equal(await mesh[0].echo(small), small)
            node = current_node()
            assert node is not None and node.channel is not None
            assert node.channel._registry is None  # type: ignore[attr-defined]  # never needed

    run_trio(body, timeout=150)


PLAIN_PROGRAM = '''
import torch

import otpmesh
from otpmesh._node._node import current_node


def offered() -> int:
    """Buffers this process's node has offered on its tensor channel so far."""
    registry = current_node().channel._registry
    return 0 if registry is None else registry._issued


class Holder(otpmesh.Actor):
    @otpmesh.endpoint
    def echo(self, t):
        return t

    @otpmesh.endpoint
    def offered(self) -> int:
        return offered()


async def main() -> None:
    async with await otpmesh.proc_mesh(procs=1) as procs:
        holder = (await procs.spawn("h", Holder))[0]
        big = torch.randn(16 << 20)  # 64 MiB
        back = await holder.echo(big)
        assert torch.equal(back, big)
        print("controller offered", offered(), "worker offered", await holder.offered())


if __name__ == "__main__":
    otpmesh.run(main)
'''


def test_a_plain_import_otpmesh_program_moves_64_mib_over_the_channel(tmp_path: Path) -> None:
    """No `import otpmesh.rdma` in the program: the channel is part of every node."""
    done = run_program(tmp_path / "plain.py", PLAIN_PROGRAM)
    assert done.returncode == 0, done.stderr
    # The argument was offered by the controller's channel, the result by the worker's.
    assert "controller offered 1 worker offered 1" in done.stdout, done.stdout
