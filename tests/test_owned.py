"""Actors own meshes: one app at any depth, ownership as supervision, seen at every level.

Real worker processes throughout; SIGKILL is a real signal; no timing assertions (waits poll
for a state under a deadline)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import ActorCrash, LogKind, Mesh, Supervisor, Worker, chaos
from otpmesh._cli._treeview import TreeView
from otpmesh._controller import _owned
from otpmesh._runtime._controller_runtime import runtime
from tests.conftest import alive, run_program, run_trio
from tests.owned_actors import Finder, Forker, Replica, Service, Spawner


async def _until(check, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Poll `check()` (async, returns truthy) until it holds."""
    with trio.fail_after(timeout):
        while True:
            try:
                if await check():
                    return
            except (otpmesh.ActorDiedError, otpmesh.CallTimeoutError):
                pass  # the actor is restarting
            await trio.sleep(0.02)


def _gone(pids: list[int]) -> bool:
    return not any(alive(pid) for pid in pids)


def test_refs_to_an_actors_mesh_work_in_the_controller_and_share_the_apps_secret() -> None:
    # Issue 23, item 1: the nested mesh was a second runtime, and the controller's call to its
    # refs failed with "the peer refused this node's secret".
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Spawner)])
        async with otpmesh.start(tree) as app:
            kids = await app.actor("top/svc").kids()
            answers = (await kids.who()).values()
            assert [a[0] for a in answers] == ["top/svc/kids/0", "top/svc/kids/1"]
            procs = await app.actor("top/svc").procs_handle()
            assert isinstance(procs, otpmesh.ProcMeshRef)
            assert sorted(procs.pids) == sorted(a[1] for a in answers)
            # The controller forked them: they are its fork server's children, like any worker.
            rt_pids = {p.pid for p in (await runtime()).procs.values()}
            assert set(procs.pids) <= rt_pids

    run_trio(body)


def test_a_nested_mesh_spawns_a_class_of_the_controllers_main_file(tmp_path: Path) -> None:
    # Issue 23, item 2: "No module named '__otpmesh_main__'".
    program = """
import otpmesh
from otpmesh import Actor, Supervisor, Worker, endpoint

class Leaf(Actor):
    @endpoint
    async def hello(self):
        return "leaf " + otpmesh.context().path

class Owner(Actor):
    async def on_start(self):
        procs = await otpmesh.proc_mesh(procs=1)
        self.leaves = await procs.spawn("leaves", Leaf)

    @endpoint
    async def leaves_mesh(self):
        return self.leaves

async def main():
    async with otpmesh.start(Supervisor("app", children=[Worker("owner", Owner)])) as app:
        leaves = await app.actor("app/owner").leaves_mesh()
        print((await leaves.hello()).values())

if __name__ == "__main__":
    otpmesh.run(main)
"""
    done = run_program(tmp_path / "nested_main.py", program)
    assert done.returncode == 0, done.stderr
    assert "['leaf app/owner/leaves/0']" in done.stdout


def test_an_owners_sigkill_stops_everything_it_owns_at_every_depth() -> None:
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Spawner, kwargs={"deep": True})])
        async with otpmesh.start(tree) as app:
            svc = app.actor("top/svc")
            before = await svc.all_pids()
            assert len(before) == 1 + 2 + 2 * 2  # the owner, its 2 spawners, their 2 each
            os.kill(before[0], signal.SIGKILL)
            await _until(lambda: _async(_gone(before)))
            after = await svc.all_pids()  # restarted: a fresh process owning fresh ones
            assert not set(after) & set(before)

    run_trio(body)


async def _async(value: object) -> object:
    return value


def test_a_subtree_that_gives_up_crashes_its_owner_whose_supervisor_restarts_it() -> None:
    async def body() -> None:
        tree = Supervisor("top", intensity=5, children=[Worker("svc", Service, args=(2, 0))])
        async with otpmesh.start(tree) as app:
            svc = app.actor("top/svc")
            first = await svc.replicas_mesh()
            old_pids = [a[1] for a in await svc.fan()]
            with pytest.raises(otpmesh.ActorError):
                await first[1].crash()  # intensity 0: the replicas' supervisor gives up
            await _until(lambda: _async(_started(app, "top/svc", 2)))
            await app.settled()
            await _until(lambda: _new_fan(svc, old_pids))
            assert _gone(old_pids)
            exits = [
                (e.child_path, e.reason)
                for e in app.events.of_kind(LogKind.CHILD_EXITED)
                if e.child_path in ("top/svc", "top/svc/replicas/1")
            ]
            # The escalation path: the replica crashed, then its owner with the subtree's error.
            assert [path for path, _ in exits] == ["top/svc/replicas/1", "top/svc"]
            owner_reason = exits[1][1]
            assert isinstance(owner_reason, ActorCrash)
            assert owner_reason.type_name == "SupervisorError"
            assert "replicas" in owner_reason.message
            starts = app.events.of_kind(LogKind.CHILD_STARTED)
            assert [e.incarnation for e in starts if e.child_path == "top/svc"] == [1, 2]
            # The controller keeps the live subtree's key only, not the one that gave up.
            rt = await runtime()
            service = rt.node.sys_handlers["subtree_start"].__self__
            assert [t.label for t in service.subtrees.values()] == ["top/svc/replicas"]

    run_trio(body)


def _started(app: otpmesh.App, path: str, incarnation: int) -> bool:
    starts = app.events.of_kind(LogKind.CHILD_STARTED)
    return any(e.child_path == path and e.incarnation == incarnation for e in starts)


async def _new_fan(svc: otpmesh.ActorRef, old_pids: list[int]) -> bool:
    pids = [a[1] for a in await svc.fan()]
    return not set(pids) & set(old_pids)


def test_the_supervise_hook_handles_a_failure_and_the_owner_lives() -> None:
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Spawner, kwargs={"handled": True})])
        async with otpmesh.start(tree) as app:
            svc = app.actor("top/svc")
            kids = await svc.kids()
            with pytest.raises(otpmesh.ActorError):
                await kids[0].crash()
            await _until(lambda: svc.failures_seen())
            (failure,) = await svc.failures_seen()
            assert "top/svc/kids/0" in failure and "replica crashed on purpose" in failure
            replaced = await svc.kids()  # the owner's hook spawned a new mesh, and it lived
            assert replaced.name == "top/svc/kids1"
            await replaced.who()
            await app.settled()
            assert not [e for e in app.events.of_kind(LogKind.CHILD_EXITED)]

    run_trio(body)


def test_an_unhandled_failure_crashes_the_owner() -> None:
    async def body() -> None:
        tree = Supervisor("top", intensity=5, children=[Worker("svc", Spawner)])
        async with otpmesh.start(tree) as app:
            svc = app.actor("top/svc")
            kids = await svc.kids()
            pids = kids_pids = [a[1] for a in (await kids.who()).values()]
            with pytest.raises(otpmesh.ActorError):
                await kids[1].crash()
            await _until(lambda: _async(_gone(kids_pids)))
            await app.settled()
            (exit_,) = [
                e for e in app.events.of_kind(LogKind.CHILD_EXITED) if e.child_path == "top/svc"
            ]
            assert isinstance(exit_.reason, ActorCrash) and exit_.reason.type_name == "MeshFailure"
            assert "top/svc/kids/1" in exit_.reason.message
            fresh = await svc.kids()
            assert not {a[1] for a in (await fresh.who()).values()} & set(pids)

    run_trio(body)


def test_lookup_by_path_and_a_singleton_from_inside_an_actor() -> None:
    async def body() -> None:
        tree = Supervisor(
            "top",
            children=[Worker("svc", Service, args=(2,)), Worker("finder", Finder)],
        )
        async with otpmesh.start(tree) as app:
            finder = app.actor("top/finder")
            found = await finder.ask("top/svc/replicas")
            assert [a[0] for a in found] == ["top/svc/replicas/0", "top/svc/replicas/1"]
            (one,) = await finder.ask("top/svc/replicas/1")
            assert one[0] == "top/svc/replicas/1"
            with pytest.raises(otpmesh.ActorError, match="no actor or mesh at 'nope'"):
                await finder.ask("nope")
            first = await finder.registry()
            again = await (await otpmesh.singleton("registry", Replica)).who()
            assert first[:3] == again[:3] == ["singletons/registry", first[1], "single"]
            # Seen from the top: the owned subtree's supervisor and actors, by path.
            assert len(app.which_children("top/svc/replicas")) == 2
            assert (await app.actor("top/svc/replicas/0").who())[0] == "top/svc/replicas/0"

    run_trio(body)


def test_actor_mesh_stop_runs_on_stop_and_stopping_twice_is_an_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("r", Replica, "t", str(tmp_path))
            await mesh.who()
            await mesh.stop()
            assert sorted(p.name for p in tmp_path.iterdir()) == ["r_0", "r_1"]
            with pytest.raises(otpmesh.MeshError, match="already stopped"):
                await mesh.stop()
            again = await procs.spawn("r2", Replica)  # the processes stayed
            assert len((await again.who()).values()) == 2
        with pytest.raises(otpmesh.MeshError, match="already stopped"):
            await procs.stop()
        with pytest.raises(otpmesh.MeshError, match="is stopped"):
            await procs.spawn("late", Replica)

    run_trio(body)


def test_a_proc_mesh_travels_in_a_message_and_slices() -> None:
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Spawner)])
        async with otpmesh.start(tree) as app:
            procs = await app.actor("top/svc").procs_handle()
            one = procs.slice(procs=1)
            assert one.shape == {} and one.pids == [procs.pids[1]]
            mesh = await one.spawn("solo", Replica, "s")
            assert (await mesh.who()).values()[0][:3] == ["top/svc/solo/0", procs.pids[1], "s"]
            await one.stop()
            await _until(lambda: _async(not alive(procs.pids[1])))
            assert alive(procs.pids[0])  # only the slice's processes

    run_trio(body)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_no_orphans_when_the_app_stops() -> None:
    async def body() -> list[int]:
        tree = Supervisor("top", children=[Worker("svc", Spawner, kwargs={"deep": True})])
        async with otpmesh.start(tree) as app:
            pids: list[int] = await app.actor("top/svc").all_pids()
        return pids

    pids = run_trio(body)
    assert _gone(pids)


def test_three_levels_under_a_seeded_fault_plan_answer_or_fail_as_documented() -> None:
    """The controller's tree holds a Mesh of 4 services; each owns a ONE_FOR_ONE mesh of 4
    replicas (a subtree started in on_start). 30 seeded faults (crash, SIGKILL, wedge) at
    services and replicas, then the services' supervisor killed: every call is answered or
    fails with a documented error, and no process of a stopped owner survives."""
    documented = (otpmesh.ActorDiedError, otpmesh.ActorError, otpmesh.CallTimeoutError)

    async def body() -> None:
        services = Mesh(
            "service",
            Service,
            shape={"procs": 4},
            args=(4, 1000, 1.0),  # 4 replicas each, intensity 1000, progress deadline 1 s
            intensity=1000,
            period=60.0,
            progress_deadline=5.0,
        )
        tree = Supervisor("rl", intensity=100, period=60.0, children=[services])
        seen: set[int] = set()
        failures: list[str] = []
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("rl/service").with_timeout(15.0)

            async def observe() -> set[int]:
                now: set[int] = set()
                for rank in range(4):
                    try:
                        now.add(await mesh[rank].pid())
                        now.update(answer[1] for answer in await mesh[rank].fan())
                    except documented as exc:
                        failures.append(type(exc).__name__)
                seen.update(now)
                return now

            await observe()
            plan = chaos.FaultPlan.seeded(
                app,
                seed=23,
                steps=31,
                count=30,
                faults={"crash": 1.0, "kill": 1.0, "wedge": 0.3},
            )
            levels = {fault.path.count("/") for fault in plan.faults}
            assert levels == {2, 4}, plan  # services and replicas
            top = chaos.PlannedFault(31, "kill", "rl/service")  # the services' supervisor
            plan = chaos.FaultPlan([*plan.faults, top])
            hits = 0
            for step in range(32):
                hits += sum(fault.hit for fault in await plan.inject(app, step))
                await observe()
            assert hits >= 28, plan  # a fault misses only an actor its owner is restarting
            await app.settled()
            current: set[int] = set()
            for _ in range(3):  # calls sent while a restart was under way may fail: ask again
                current = await observe()
                if len(current) == 4 + 16:
                    break
            assert len(current) == 4 + 16
            stale = seen - current
            await _until(lambda: _async(_gone(sorted(stale))))
            assert len(app.events.of_kind(LogKind.FAULT_INJECTED)) >= 31

    run_trio(body, timeout=170)


def test_an_owned_subtree_is_seen_in_the_stacks_and_the_live_view_under_its_owner() -> None:
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Service, args=(2,))])
        async with otpmesh.start(tree) as app:
            stacks = await app.stacks("top/svc/replicas")
            assert sorted(stacks.actors) == ["top/svc/replicas/0", "top/svc/replicas/1"]
            view = TreeView(tree)
            for entry in app.events:
                view.feed(entry)
            assert view["top/svc"].children == ["top/svc/replicas"]
            replicas = view["top/svc/replicas"]
            assert replicas.children == ["top/svc/replicas/0", "top/svc/replicas/1"]
            assert {view[p].state for p in replicas.children} == {"running"}

    run_trio(body)


def test_the_owned_benchmark_runs_and_reports_each_figure_beside_its_baseline() -> None:
    from otpmesh.bench.owned import owned_benchmark

    logger = logging.getLogger("otpmesh")
    before = logger.level
    result = run_trio(lambda: owned_benchmark(trials=1, kills=1, lookups=5), timeout=120)
    # It quiets its planned kills for its own run only: left at CRITICAL, it silenced every
    # later test of this process that reads otpmesh's warnings (caplog).
    assert logger.level == before
    assert result["mesh_4_to_first_reply_ms"]["owned_vs_controller"] > 0
    assert result["sigkill_to_next_reply_ms"]["level_3_vs_top"] > 0
    assert result["lookup_from_an_actor_us"]["lookup_vs_call"] > 0


def test_another_actor_cannot_stop_a_mesh_it_neither_owns_nor_spawned() -> None:
    async def body() -> None:
        tree = Supervisor("top", children=[Worker("svc", Spawner), Worker("f", Finder)])
        async with otpmesh.start(tree) as app:
            with pytest.raises(otpmesh.ActorError, match="may be stopped only by its owner"):
                await app.actor("top/f").stop_found("top/svc/kids")
            kids = await app.actor("top/svc").kids()
            assert len((await kids.who()).values()) == 2  # still running
            procs = await app.actor("top/svc").procs_handle()
            assert len(procs._id) > 16  # a handle is a capability: its id cannot be guessed
            await kids.stop()  # the controller may

    run_trio(body)


def test_an_actor_owns_at_most_its_bound_of_processes_and_a_stop_frees_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loop of proc_mesh() requests (a bug, or a compromised actor) must not fork the host out
    # of memory: each owner may hold OTPMESH_MAX_OWNED_PROCS processes at once.
    monkeypatch.setattr(_owned, "MAX_OWNED_PROCS", 3)

    async def body() -> None:
        async with otpmesh.start(Supervisor("top", children=[Worker("f", Forker)])) as app:
            forker = app.actor("top/f")
            assert await forker.fork(2) == 2
            assert await forker.fork_slice() == 1  # the same processes: nothing more held
            with pytest.raises(otpmesh.ActorError, match=r"asked for 2 more .* owns 2 of its 3"):
                await forker.fork(2)
            assert await forker.fork(1) == 1  # up to the bound
            await forker.stop_first()  # frees its 2 (its slice's process among them)
            assert await forker.fork(2) == 2

    run_trio(body, timeout=120)
