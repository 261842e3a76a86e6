"""Imperative spawns: supervised when given a strategy, and never silent when not."""

from __future__ import annotations

import os
import signal

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ALL, ONE_FOR_ONE, LogKind
from tests.actors import Configured, Member
from tests.conftest import run_trio


def test_spawn_with_a_strategy_makes_a_supervisor_group_on_the_proc_mesh() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=3) as procs:
            mesh = await procs.spawn_supervised("w", Member, strategy=ONE_FOR_ONE, intensity=3)
            pids = (await mesh.pid()).values()
            assert pids == procs.pids  # the group runs on the proc mesh's own processes
            with pytest.raises(otpmesh.ActorError, match="on purpose"):
                await mesh[1].crash()
            assert (await mesh.count()).values() == [1, 1, 1]
            assert (await mesh.count()).values() == [2, 2, 2]
            group = procs.supervision("w")
            await group.settled()
            exits = group.events.of_kind(LogKind.CHILD_EXITED)
            assert [(e.child_path, e.incarnation) for e in exits] == [("w/1", 1)]

            os.kill(pids[2], signal.SIGKILL)
            with trio.fail_after(10):
                while True:
                    try:
                        if await mesh[2].pid() != pids[2]:
                            break  # rank 2 lives again, in a new process on its slot
                    except otpmesh.ActorDiedError:
                        pass  # a call sent before the kill was noticed
                    await trio.sleep(0.01)

    run_trio(body)


def test_a_supervised_group_that_gives_up_fails_its_calls_and_says_why() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn_supervised("dp", Member, strategy=ONE_FOR_ALL, intensity=0)
            with pytest.raises(otpmesh.ActorError):
                await mesh[0].crash()
            await procs.supervision("dp").settled()
            with pytest.raises(otpmesh.ActorDiedError, match="supervisor dp exited"):
                await mesh[1].ping()

    run_trio(body)


def test_an_unsupervised_mesh_failure_is_an_event_and_an_error_never_silent() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("u", Member)
            with pytest.raises(otpmesh.ActorError):
                await mesh[0].crash("lost")
            with pytest.raises(otpmesh.ActorDiedError, match="u/0 is dead: crashed"):
                await mesh[0].ping()
            with trio.fail_after(5):
                while not procs.events.of_kind(LogKind.CHILD_EXITED):
                    await trio.sleep(0.01)
            [entry] = procs.events.of_kind(LogKind.CHILD_EXITED)
            assert entry.child_path == "u/0"
            assert otpmesh.describe(entry.reason) == "crashed with RuntimeError: lost"
            with pytest.raises(otpmesh.MeshError, match="not spawned as a supervised mesh"):
                procs.supervision("u")

    run_trio(body)


def test_an_actors_own_keywords_are_never_taken_for_supervision_settings() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            plain = await procs.spawn("p", Configured, strategy="greedy", period=0.5)
            assert await plain[0].settings_seen() == {"strategy": "greedy", "period": 0.5}
            with pytest.raises(otpmesh.MeshError, match="not spawned as a supervised mesh"):
                procs.supervision("p")  # plain spawn supervises nothing
            group = await procs.spawn_supervised(
                "s", Configured, kwargs={"strategy": "beam", "period": 2.0}, intensity=2
            )
            assert await group[0].settings_seen() == {"strategy": "beam", "period": 2.0}
            assert procs.supervision("s").events.of_kind(LogKind.CHILD_STARTED)

    run_trio(body)
