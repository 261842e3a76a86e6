"""Meshes that are process groups: torch.distributed (gloo, CPU) across a Mesh's actors, formed
afresh under a new epoch at every restart of the group, over real worker processes."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ALL, LogKind, Mesh, Supervisor
from otpmesh._controller._app import context
from otpmesh._controller._pgplacement import GroupPlacement
from otpmesh._core._spec import Strategy
from tests import test_multihost as multihost
from tests.conftest import run_trio

pytest.importorskip("torch.distributed")

# The namespaced hosts of the multi-host tests (and their cluster secret), for a group across hosts.
cluster_secret = multihost.cluster_secret
spaces = multihost.spaces
where = multihost.where

# Generous hang guards: four workers joining a group on two loaded cores take a while.
GUARD = 60.0


@pytest.fixture(autouse=True)
def _preload_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Members import torch.distributed: have the fork server import it once, before it forks.
    monkeypatch.setenv("OTPMESH_PRELOAD", "torch,torch.distributed")


class Member(otpmesh.Actor):
    """A group member: all-reduces, reports where it is, crashes on request."""

    def __init__(self) -> None:
        self.epoch = otpmesh.group().epoch  # the group is formed before the constructor runs

    @otpmesh.endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value])
        dist.all_reduce(tensor)  # the default group is the mesh's
        return float(tensor.item())

    @otpmesh.endpoint
    def where(self) -> dict[str, Any]:
        import torch.distributed as dist

        group = otpmesh.group()
        return {
            "epoch": group.epoch,
            "rank": group.rank,
            "size": group.size,
            "dist_rank": dist.get_rank(),
            "dist_size": dist.get_world_size(),
            "pid": os.getpid(),
            "store": group.store,
        }

    @otpmesh.endpoint
    def crash(self) -> None:
        raise RuntimeError("a member fails")


def _group(size: int, name: str = "dp", **kwargs: Any) -> Mesh:
    return Mesh(
        name,
        Member,
        shape={"procs": size},
        strategy=ONE_FOR_ALL,
        intensity=5,
        period=60.0,
        process_group="gloo",
        **kwargs,
    )


def test_a_group_of_four_all_reduces_with_mesh_ranks() -> None:
    tree = Supervisor("root", children=[_group(4)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("root/dp")
            assert (await mesh.all_reduce(1.0)).values() == [4.0] * 4
            members = (await mesh.where()).values()
            assert [w["rank"] for w in members] == [w["dist_rank"] for w in members] == [0, 1, 2, 3]
            assert {w["size"] for w in members} == {w["dist_size"] for w in members} == {4}
            assert {w["epoch"] for w in members} == {1}
            assert len({w["pid"] for w in members}) == 4

    run_trio(body, GUARD)


async def _kill_during_all_reduce(app: otpmesh.App, how: str) -> None:
    """Ranks 0-2 enter all_reduce, which blocks without rank 3; then rank 3 fails."""
    mesh = app.mesh("root/dp")
    pids = [w["pid"] for w in (await mesh.where()).values()]
    failures: list[BaseException] = []

    async def blocked(rank: int) -> None:
        try:
            await mesh[rank].all_reduce(1.0)
        except otpmesh.OtpmeshError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        for rank in range(3):
            nursery.start_soon(blocked, rank)
        await trio.sleep(0.5)  # not a timing assumption: they block either way
        if how == "sigkill":
            os.kill(pids[3], signal.SIGKILL)
        else:
            with pytest.raises(otpmesh.ActorError, match="a member fails"):
                await mesh[3].crash()
    # The three blocked members were freed: killed with their group (or, first, failed by gloo
    # itself when it saw the dead peer's sockets close), and their calls failed.
    assert len(failures) == 3
    assert all(isinstance(f, otpmesh.ActorDiedError | otpmesh.ActorError) for f in failures)
    await app.settled()
    members = (await mesh.where()).values()
    assert {w["epoch"] for w in members} == {2}
    assert not {w["pid"] for w in members} & set(pids), "all four members are new processes"
    assert (await mesh.all_reduce(2.0)).values() == [8.0] * 4
    # One exit was the group's failure (rank 3's, or a peer's whose gloo saw it first), and
    # one restart of the whole group followed.
    assert len(app.events.of_kind(LogKind.CHILD_EXITED)) == 1
    started = [e.child_path for e in app.events.of_kind(LogKind.CHILD_STARTED)]
    assert started.count("root/dp/0") == 2 and started.count("root/dp/3") == 2


def test_sigkill_of_a_member_blocked_peers_are_replaced_under_a_new_epoch() -> None:
    tree = Supervisor("root", children=[_group(4)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            await _kill_during_all_reduce(app, "sigkill")

    run_trio(body, GUARD)


def test_a_member_crash_by_exception_restarts_the_group_under_a_new_epoch() -> None:
    tree = Supervisor("root", children=[_group(4)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            await _kill_during_all_reduce(app, "crash")

    run_trio(body, GUARD)


def test_a_stale_member_cannot_join_the_new_epoch() -> None:
    from otpmesh._runtime import _pgmember

    tree = Supervisor("root", children=[_group(2)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("root/dp")
            placement = context(app).placement
            assert isinstance(placement, GroupPlacement)
            group = placement.groups["root/dp"]
            assert group.epoch is not None
            stale = dict(group.ticket(group.epoch, 1), connect_timeout=1.0)
            with pytest.raises(otpmesh.ActorError):
                await mesh[0].crash()
            await app.settled()
            assert {w["epoch"] for w in (await mesh.where()).values()} == {2}
            assert group.epoch.number == 2
            # Its own epoch's store is closed: nothing answers there any more.
            with pytest.raises(RuntimeError, match="connect"):
                await trio.to_thread.run_sync(_pgmember.connect, stale)
            # The new epoch's store refuses a member of the old one, before any key is read.
            moved = dict(stale, store=group.epoch.address)
            with pytest.raises(otpmesh.StaleEpochError, match=r"member of epoch 1 .* epoch 2"):
                await trio.to_thread.run_sync(_pgmember.connect, moved)
            # And the group goes on.
            assert (await mesh.all_reduce(1.0)).values() == [2.0, 2.0]

    run_trio(body, GUARD)


def test_two_process_groups_in_one_tree_do_not_interfere() -> None:
    tree = Supervisor("root", children=[_group(2, "a"), _group(2, "b")])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a, b = app.mesh("root/a"), app.mesh("root/b")
            async with trio.open_nursery() as nursery:
                results: dict[str, list[float]] = {}

                async def reduce(name: str, mesh: otpmesh.ActorMesh, value: float) -> None:
                    results[name] = (await mesh.all_reduce(value)).values()

                nursery.start_soon(reduce, "a", a, 1.0)
                nursery.start_soon(reduce, "b", b, 10.0)
            assert results == {"a": [2.0, 2.0], "b": [20.0, 20.0]}
            stores = {w["store"] for w in (await a.where()).values()}
            assert stores.isdisjoint(w["store"] for w in (await b.where()).values())
            # A crash in b re-forms b only (a keeps its epoch and its processes).
            a_before = (await a.where()).values()
            with pytest.raises(otpmesh.ActorError):
                await b[1].crash()
            await app.settled()
            assert (await a.where()).values() == a_before
            assert {w["epoch"] for w in (await b.where()).values()} == {2}
            assert (await b.all_reduce(1.0)).values() == [2.0, 2.0]

    run_trio(body, GUARD)


@pytest.mark.parametrize("strategy", ["one_for_one", "rest_for_one"])
def test_a_strategy_that_replaces_one_member_is_refused_at_spec_time(strategy: str) -> None:
    with pytest.raises(
        otpmesh.SpecError,
        match=rf"Mesh 'dp': strategy='{strategy}' is invalid \(a torch.distributed group "
        r"cannot admit a replacement rank.*use strategy=ONE_FOR_ALL\)",
    ):
        Mesh("dp", Member, shape={"procs": 2}, strategy=Strategy(strategy), process_group="gloo")


def test_an_unknown_backend_is_refused_at_spec_time() -> None:
    with pytest.raises(otpmesh.SpecError, match=r"process_group='mpi' is invalid; allowed: None"):
        Mesh("dp", Member, strategy=ONE_FOR_ALL, process_group="mpi")


def test_a_process_group_needs_worker_processes() -> None:
    tree = Supervisor("root", children=[_group(2)])

    async def body() -> None:
        with pytest.raises(ValueError, match="needs placement='procs'"):
            async with otpmesh.start(tree, placement="local"):
                pass

    run_trio(body, GUARD)


def test_group_outside_a_member_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match=r"only available inside an actor of a Mesh with"):
        otpmesh.group()


def test_the_data_parallel_group_tree_steps_together_and_resumes_from_its_checkpoint(
    tmp_path: Any,
) -> None:
    from supervisors import data_parallel

    tree = data_parallel.make_group_tree(gpus=2, checkpoint=str(tmp_path / "dp.json"))
    batch = [1.0, 2.0, 3.0, 4.0]

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            dp = app.mesh("dp")
            for _ in range(3):
                await dp.train_step(batch)
            assert len(set((await dp.state()).values())) == 1  # the ranks agree
            with pytest.raises(otpmesh.ActorError, match="FloatingPointError"):
                await dp[1].train_step([1.0, float("nan"), 3.0, 4.0])  # rank 1's shard is poisoned
            await app.settled()
            # Both ranks are back at the step-2 checkpoint, in a new group.
            assert [s[0] for s in (await dp.state()).values()] == [2, 2]
            await dp.train_step(batch)
            assert [s[0] for s in (await dp.state()).values()] == [3, 3]

    run_trio(body, GUARD)


def test_a_group_across_two_hosts_survives_a_host_kill(where: Any) -> None:
    mesh = Mesh(
        "dp",
        Member,
        shape={"hosts": 2, "procs": 1},
        strategy=ONE_FOR_ALL,
        intensity=5,
        period=60.0,
        process_group="gloo",
    )
    tree = Supervisor("root", children=[mesh])

    async def body() -> None:
        async with where(3) as hosts, otpmesh.start(tree) as app:
            dp = app.mesh("root/dp")
            assert (await dp.all_reduce(1.0)).values() == [2.0, 2.0]
            before = (await dp.where()).values()
            os.kill(multihost.hosts_launcher(hosts).processes[1].pid, signal.SIGKILL)  # host 1 dies
            await app.settled()
            with trio.fail_after(30):  # a hang guard: the lost host is found by heartbeats
                while not app.events.of_kind(LogKind.CHILD_EXITED):
                    await trio.sleep(0.05)
            await app.settled()
            after = (await dp.where()).values()
            assert {w["epoch"] for w in after} == {2}
            assert not {w["pid"] for w in after} & {w["pid"] for w in before}
            assert (await dp.all_reduce(3.0)).values() == [6.0, 6.0]

    run_trio(body, 90.0)
