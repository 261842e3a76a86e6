"""Calling actor meshes over real worker processes: call, broadcast, choose, stream, slicing."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh._node._endpoint import Endpoint
from tests.actors import Echo, Member
from tests.conftest import run_trio


def test_call_returns_a_value_mesh_in_rank_order_with_contexts() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(hosts=2, gpus=2) as procs:
            mesh = await procs.spawn("workers", Echo, tag="t")
            result = await mesh.whoami()
            assert isinstance(result, otpmesh.ValueMesh)
            assert [v["rank"] for v in result] == [0, 1, 2, 3]
            assert result.item(hosts=1, gpus=0)["path"] == "workers/2"
            assert result.item(hosts=0, gpus=1)["coords"] == {"hosts": 0, "gpus": 1}
            assert {v["shape"]["gpus"] for v in result.values()} == {2}
            assert len({v["pid"] for v in result}) == 4
            assert all(v["pid"] != os.getpid() for v in result)
            assert [c for c, _ in result.items()][3] == {"hosts": 1, "gpus": 1}
            same = await mesh.whoami.call()
            assert same.values() == result.values()

    run_trio(body)


def test_unicast_and_call_one_return_one_value() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            mesh = await procs.spawn("w", Echo)
            assert await mesh[1].echo({"a": (1, 2)}) == {"a": (1, 2)}
            assert await mesh[-1].echo.call_one(7) == 7
            assert (await mesh[2].echo.call(5)).item() == 5
            with pytest.raises(otpmesh.MeshError, match="call_one on w of 3 actors"):
                await mesh.echo.call_one(1)
            with pytest.raises(IndexError, match="rank 3 is out of range for w of 3 actors"):
                mesh[3]

    run_trio(body)


def test_a_call_that_reaches_a_member_between_its_crash_and_restart_is_resent_to_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The call goes out to every member at once (each up, its connection open), one of them
    has just crashed (its crash was sent first, in the same scheduler pass): that member's
    worker answers that no actor took the call, and only that member is called again, on its
    next incarnation; the other runs the call once."""
    tree = otpmesh.Supervisor(
        "s",
        children=[otpmesh.Mesh("m", Member, shape={"procs": 2}, strategy=otpmesh.ONE_FOR_ONE)],
    )
    general: list[int] = []  # the members each call sent the general way
    outcomes = Endpoint._outcomes

    async def spy(self: Endpoint, slots: Any, *rest: Any) -> Any:
        general.append(len(slots))
        return await outcomes(self, slots, *rest)

    monkeypatch.setattr(Endpoint, "_outcomes", spy)

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/m")
            assert (await mesh.count.call()).values() == [1, 1]
            assert (await mesh.count.call()).values() == [2, 2]
            assert general == []  # every member up and connected: sent at once
            await mesh[0].crash.broadcast()
            assert (await mesh.count.call()).values() == [1, 3]
            assert general == [1]  # member 0 alone, again

    run_trio(body)


def test_slices_select_sub_meshes() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(hosts=2, gpus=3) as procs:
            mesh = await procs.spawn("w", Echo)
            row = mesh.slice(hosts=1)
            assert row.shape == {"gpus": 3}
            assert [v["rank"] for v in await row.whoami()] == [3, 4, 5]
            part = mesh.slice(gpus=slice(0, 2))
            assert part.shape == {"hosts": 2, "gpus": 2}
            values = await part.whoami()
            assert [v["rank"] for v in values] == [0, 1, 3, 4]
            assert values.item(hosts=1, gpus=1)["rank"] == 4
            one = mesh.slice(hosts=0, gpus=2)
            assert (await one.whoami.call_one())["rank"] == 2
            with pytest.raises(otpmesh.MeshError, match="no dimension"):
                mesh.slice(procs=0)
            with pytest.raises(otpmesh.MeshError, match="out of range"):
                mesh.slice(gpus=3)

    run_trio(body)


def test_broadcast_is_fifo_with_later_calls_from_the_same_caller() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            for i in range(200):
                await mesh.record.broadcast(i)
            histories = await mesh.history()
            assert [h for h in histories] == [list(range(200))] * 2

    run_trio(body)


def test_choose_calls_exactly_one_actor_and_balances_load() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            mesh = await procs.spawn("w", Echo)
            async with trio.open_nursery() as nursery:
                for i in range(9):
                    nursery.start_soon(mesh.record.choose, i)
            histories = (await mesh.history()).values()
            assert sorted(x for h in histories for x in h) == list(range(9))
            assert [len(h) for h in histories] == [3, 3, 3]

    run_trio(body)


def test_stream_yields_replies_as_they_arrive(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            mesh = await procs.spawn("w", Echo)
            seen = [(c, v) async for c, v in mesh.whoami.stream()]
            assert sorted(c["procs"] for c, _ in seen) == [0, 1, 2]
            assert all(v["coords"] == c for c, v in seen)
            # Rank 0 stays busy until the stream has yielded the other two replies: a stream
            # that waited for all three would never get there (the deadline below fails it).
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(mesh[0].hold, str(gate))
                    while not Path(f"{gate}.held").exists():
                        await trio.sleep(0.01)
                    order: list[int] = []
                    async for c, _ in mesh.echo.stream(1):
                        order.append(c["procs"])
                        if len(order) == 2:
                            gate.touch()
            assert sorted(order[:2]) == [1, 2] and order[2] == 0

    run_trio(body)


def test_a_stream_left_early_leaves_trio_sound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Left by a `break` and by an error in the loop's body, never closed: Python finalizes such
    # a generator later, from a task of trio's own. A nursery held open across the yields made
    # that task exit a cancel scope of the caller's ("Cancel scope stack corrupted").
    gate = tmp_path / "gate"

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            mesh = await procs.spawn("w", Echo)
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(mesh[0].hold, str(gate))
                    while not Path(f"{gate}.held").exists():
                        await trio.sleep(0.01)
                    async for _ in mesh.record.stream(1):
                        break  # rank 0's call is still out, queued behind `hold`
                    with pytest.raises(KeyError):
                        async for _ in mesh.record.stream(2):
                            raise KeyError("the loop's body failed")
                    gc.collect()
                    for _ in range(10):
                        await trio.sleep(0.01)
                    gate.touch()
                with trio.CancelScope():  # scopes still open and close in order
                    assert [v async for _, v in mesh.echo.stream(3)] == [3, 3, 3]
                assert await mesh[1].history() == [1, 2]

    with caplog.at_level(logging.ERROR):
        run_trio(body)
    assert not [r for r in caplog.records if r.name.startswith("trio")], caplog.text


def test_every_call_takes_a_timeout_that_names_the_actor() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(
                otpmesh.CallTimeoutError, match=r"'sleep' on w/1 timed out after 0.2 s"
            ):
                await mesh[1].sleep.with_timeout(0.2)(1.5)
            with pytest.raises(TimeoutError, match=r"w/0, w/1"):
                await mesh.with_timeout(0.2).sleep(1.5)
            # the actor is still alive and answers later calls
            assert await mesh[0].echo(3) == 3

    run_trio(body)


def test_unknown_endpoint_is_an_attribute_error_naming_the_endpoints() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(AttributeError, match=r"w has no endpoint 'nope'.*echo"):
                _ = mesh.nope

    run_trio(body)


def test_refs_pass_between_actors_and_calls_go_direct() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            other = await procs.spawn("other", Echo)
            pids = (await mesh.pid()).values()
            got = await mesh[0].call_peer(mesh[1], "hi")
            assert got == {"value": "hi", "via_pid": pids[0]}
            # same process: actor w/0 calls other/0, which shares its process
            local = await mesh[0].call_peer(other[0], [1, 2])
            assert local == {"value": [1, 2], "via_pid": pids[0]}
            # a whole mesh travels too
            meshes = await mesh[1].call_peer(other, 5)
            assert meshes["value"].values() == [5, 5]

    run_trio(body)


def test_spawn_errors_are_clear() -> None:
    from tests.actors import BadInit

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            with pytest.raises(otpmesh.SpawnError, match="constructor refused"):
                await procs.spawn("bad", BadInit)
            await procs.spawn("w", Echo)
            with pytest.raises(otpmesh.MeshError, match="already has an actor mesh named 'w'"):
                await procs.spawn("w", Echo)
            with pytest.raises(TypeError, match="Actor subclass"):
                await procs.spawn("x", dict)  # type: ignore[arg-type]

    run_trio(body)


def test_bad_shapes_are_rejected() -> None:
    async def body() -> None:
        with pytest.raises(otpmesh.MeshError, match="at least one dimension"):
            await otpmesh.proc_mesh()
        with pytest.raises(otpmesh.MeshError, match="gpus=0 must be a positive int"):
            await otpmesh.proc_mesh(gpus=0)

    run_trio(body)
