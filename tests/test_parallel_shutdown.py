"""A Mesh stops its members all at once, as OTP's ``simple_one_for_one`` does; an ordinary
supervisor still stops its children one at a time, newest first (OTP rule 8).

The core's commands first (pure), then the same under MockClock (exact times, in-process), then
real worker processes stuck in plain-def endpoints: the stop requests to every member are all out
before any of them is answered, on every path that stops a mesh (the app's stop, a one_for_all
restart inside the mesh, its parent terminating it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import chaos
from otpmesh._controller._app import context
from otpmesh._core._children import ChildStatus
from otpmesh._core._spec import BRUTAL_KILL, ONE_FOR_ALL, REST_FOR_ONE, Mesh, Supervisor, Worker
from otpmesh._core._spec_errors import SpecError
from otpmesh._core._supervisor import SupervisorCore
from otpmesh._core._supevents import (
    ChildExited,
    ChildStarted,
    ChildTerminated,
    Exit,
    InitDone,
    LogKind,
    StartChild,
    Stop,
    TerminateChild,
)
from otpmesh.testing import Crash, simulate
from tests import actors
from tests.actors import Member
from tests.conftest import run_trio


class A(otpmesh.Actor):
    """An actor class; the core never instantiates it."""


def started(spec: Supervisor) -> SupervisorCore:
    core = SupervisorCore(spec)
    commands = core.start(0.0)
    while commands and isinstance(commands[-1], StartChild):
        commands = core.handle(ChildStarted(commands[-1].id), 0.0)
    assert commands == [InitDone()]
    return core


def group(**kw: object) -> Supervisor:
    return Mesh("m", A, shape={"procs": 4}, **kw).as_supervisor()  # type: ignore[arg-type]


# ---------------------------------------------------------------- the core


def test_a_mesh_group_is_a_parallel_shutdown_supervisor_and_others_are_not() -> None:
    assert group().parallel_shutdown is True
    assert Supervisor("s").parallel_shutdown is False
    with pytest.raises(SpecError, match=r"parallel_shutdown.*'yes'.*True or False"):
        Supervisor("s", parallel_shutdown="yes")  # type: ignore[arg-type]


def test_stopping_a_mesh_group_asks_every_member_at_once_and_exits_after_the_last() -> None:
    core = started(group(shutdown=5.0))
    commands = core.handle(Stop(), 1.0)
    assert commands == [TerminateChild(str(r), 1, 5.0) for r in (3, 2, 1, 0)]
    assert set(core.outstanding) == set(commands)
    # Answered in any order; the group exits once every member is gone.
    assert core.handle(ChildTerminated("1", 1, "killed"), 2.0) == []
    assert core.handle(ChildTerminated("3", 1, "shutdown"), 2.0) == []
    assert core.handle(ChildTerminated("0", 1, "shutdown"), 2.0) == []
    assert core.handle(ChildTerminated("2", 1, "shutdown"), 2.0) == [Exit("shutdown")]
    terminated = [(e.child, e.reason) for e in core.take_log() if e.kind == "child_terminated"]
    assert terminated == [("1", "killed"), ("3", "shutdown"), ("0", "shutdown"), ("2", "shutdown")]


def test_an_ordinary_supervisor_still_stops_one_child_at_a_time_newest_first() -> None:
    spec = Supervisor("s", children=[Worker(str(r), A) for r in range(3)])
    core = started(spec)
    assert core.handle(Stop(), 1.0) == [TerminateChild("2", 1, 5.0)]
    assert core.handle(ChildTerminated("2", 1, "shutdown"), 1.0) == [TerminateChild("1", 1, 5.0)]


def test_a_one_for_all_restart_stops_the_other_members_at_once_then_starts_in_order() -> None:
    spec = group(strategy=ONE_FOR_ALL, intensity=3)
    core = started(spec)
    commands = core.handle(ChildExited("1", 1, "crash"), 1.0)
    assert commands == [TerminateChild(str(r), 1, 5.0) for r in (3, 2, 0)]
    assert core.handle(ChildTerminated("0", 1, "shutdown"), 1.0) == []
    assert core.handle(ChildTerminated("3", 1, "shutdown"), 1.0) == []
    first = core.handle(ChildTerminated("2", 1, "shutdown"), 1.0)
    assert first == [StartChild("0", 2, spec.children[0])]


def test_a_rest_for_one_restart_stops_the_later_members_at_once() -> None:
    core = started(group(strategy=REST_FOR_ONE, intensity=3))
    commands = core.handle(ChildExited("1", 1, "crash"), 1.0)
    assert commands == [TerminateChild("3", 1, 5.0), TerminateChild("2", 1, 5.0)]


def test_a_member_whose_exit_is_already_queued_is_not_asked_to_stop() -> None:
    core = started(group(shutdown=BRUTAL_KILL))
    assert isinstance(core.handle(ChildExited("0", 1, "crash"), 1.0)[0], StartChild)
    # While the core waits for that restart, a stop and then member 2's own exit queue up.
    assert core.handle(Stop(), 1.0) == []
    assert core.handle(ChildExited("2", 1, "crash"), 1.0) == []
    commands = core.handle(ChildStarted("0"), 1.0)
    assert commands == [
        TerminateChild(r, i, BRUTAL_KILL) for r, i in (("3", 1), ("1", 1), ("0", 2))
    ]
    for r, i in (("1", 1), ("0", 2)):
        assert core.handle(ChildTerminated(r, i, "killed"), 1.0) == []
    assert core.handle(ChildTerminated("3", 1, "killed"), 1.0) == [Exit("shutdown")]
    terminated = [(e.child, e.reason) for e in core.take_log() if e.kind == "child_terminated"]
    assert terminated[0] == ("2", "crash")  # its queued exit, consumed (OTP's unlink_flush)
    assert {c.status for c in core.which_children()} == {ChildStatus.UNDEFINED}


def test_the_simulated_tree_stops_a_mesh_in_one_batch() -> None:
    tree = Supervisor("root", children=[Mesh("m", A, shape={"procs": 3}, strategy=ONE_FOR_ALL)])
    sim = simulate(tree, [Crash("root/m/0")])
    exits = [e[1] for e in sim.trace if e[0] == "exit"]
    assert exits[:3] == ["root/m/0", "root/m/2", "root/m/1"]
    assert sim.root_exit == "shutdown"


# ---------------------------------------------------------------- in-process, exact times


def _terminated_at(app: otpmesh.App, sup: str) -> list[tuple[str | None, float]]:
    return [
        (e.child, e.time) for e in app.events.of_kind(LogKind.CHILD_TERMINATED) if e.path == sup
    ]


def test_a_mesh_of_slow_stoppers_stops_in_one_shutdown_timeout_a_supervisor_in_four() -> None:
    slow = {"stop_delay": 100.0}
    mesh = Mesh("m", Member, shape={"procs": 4}, kwargs=slow, shutdown=2.0)
    ordered = Supervisor(
        "s", children=[Worker(str(r), Member, kwargs=slow, shutdown=2.0) for r in range(4)]
    )
    tree = Supervisor("root", children=[ordered, mesh])

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            t0 = trio.current_time()
        # root stops m first (newest first): its four members at once, killed at t0 + 2 ...
        assert sorted(_terminated_at(app, "root/m")) == [(str(r), t0 + 2.0) for r in range(4)]
        # ... then s, one child after another, newest first: 2 s each.
        assert _terminated_at(app, "root/s") == [
            (str(r), t0 + 2.0 + 2.0 * (4 - r)) for r in (3, 2, 1, 0)
        ]

    actors.JOURNAL.clear()
    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


# ---------------------------------------------------------------- real processes, stuck


async def _sample(app: otpmesh.App, seen: list[tuple[str, ...]]) -> None:
    """Every 10 ms, the actors a stop waits for (asked, not yet answered)."""
    tree = context(app)
    while True:
        waiting = tuple(tree.waiting_for())
        if waiting and (not seen or seen[-1] != waiting):
            seen.append(waiting)
        await trio.sleep(0.01)


async def _stuck(app: otpmesh.App, paths: list[str], journal: Path, nursery: trio.Nursery) -> None:
    """Put every actor at `paths` into a plain-def endpoint (time.sleep) that no stop reaches."""

    async def block(path: str) -> None:
        try:
            await app.actor(path).block(30.0)
        except otpmesh.OtpmeshError:
            pass

    for path in paths:
        nursery.start_soon(block, path)
    with trio.fail_after(30):
        while journal.read_text().count(" block ") < len(paths) if journal.exists() else True:
            await trio.sleep(0.01)


MEMBERS = [f"root/m/{r}" for r in range(4)]


@pytest.mark.parametrize("how", ["app_stop", "parent_terminates", "one_for_all_restart"])
def test_a_mesh_stuck_in_sync_endpoints_is_asked_to_stop_all_at_once(
    tmp_path: Path, how: str
) -> None:
    journal = tmp_path / "journal"
    mesh = Mesh(
        "m",
        Member,
        shape={"procs": 4},
        kwargs={"journal_file": str(journal)},
        shutdown=1.0,
        strategy=ONE_FOR_ALL,
        intensity=3,
    )
    tree = Supervisor("root", children=[mesh])
    seen: list[tuple[str, ...]] = []

    async def body() -> None:
        async with trio.open_nursery() as outer:
            async with otpmesh.start(tree) as app:
                outer.start_soon(_sample, app, seen)
                async with trio.open_nursery() as calls:
                    await _stuck(app, MEMBERS, journal, calls)
                    if how == "parent_terminates":
                        await app.terminate_child("root/m")
                    elif how == "one_for_all_restart":
                        await chaos.kill(app, "root/m/0")  # the other three are stopped
                        await app.settled()
                    calls.cancel_scope.cancel()
            outer.cancel_scope.cancel()
        stopped = MEMBERS[1:] if how == "one_for_all_restart" else MEMBERS
        assert tuple(stopped) in seen  # every stop request out before any was answered
        terminated = [
            (e.child_path, e.reason)
            for e in app.events.of_kind(LogKind.CHILD_TERMINATED)
            if e.path == "root/m" and e.incarnation == 1
        ]
        # Stuck outside trio, each is killed at its own timeout: all within one.
        assert sorted(terminated) == [(p, "killed") for p in stopped]

    run_trio(body, timeout=90)


def test_an_ordinary_supervisor_of_stuck_workers_asks_them_one_at_a_time(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    kw = {"journal_file": str(journal)}
    tree = Supervisor(
        "root", children=[Worker(str(r), Member, kwargs=kw, shutdown=0.5) for r in range(2)]
    )
    seen: list[tuple[str, ...]] = []

    async def body() -> None:
        async with trio.open_nursery() as outer:
            async with otpmesh.start(tree) as app:
                outer.start_soon(_sample, app, seen)
                async with trio.open_nursery() as calls:
                    await _stuck(app, ["root/0", "root/1"], journal, calls)
                    calls.cancel_scope.cancel()
            outer.cancel_scope.cancel()
        assert seen == [("root/1",), ("root/0",)]  # newest first, never both (OTP rule 8)

    run_trio(body, timeout=60)
