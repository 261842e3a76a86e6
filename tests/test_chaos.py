"""otpmesh.chaos against real worker processes and in-process trees: each fault does what it
says, is recorded in the event log, and the tree recovers."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import ONE_FOR_ONE, TRANSIENT, LogKind, Mesh, Supervisor, Worker, chaos
from tests import actors
from tests.actors import Member
from tests.conftest import run_trio

TREE = Supervisor(
    "s",
    intensity=20,
    period=10.0,
    children=[
        Mesh("m", Member, shape={"procs": 3}, strategy=ONE_FOR_ONE, intensity=20, period=10.0),
        Worker("t", Member, restart=TRANSIENT),
    ],
)


def _faults(app: otpmesh.App) -> list[str]:
    return [str(e.reason) for e in app.events.of_kind(LogKind.FAULT_INJECTED)]


async def _until(app: otpmesh.App, kind: str, path: str) -> otpmesh.LogEntry:
    with trio.fail_after(30):  # a hang guard only: the events come in well under a second
        while True:
            for e in app.events:
                if e.kind == kind and e.child_path == path:
                    return e
            await trio.sleep(0.01)


def test_crash_kill_and_stop_are_recorded_beside_the_restarts_they_cause() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            mesh = app.mesh("s/m")
            pids = (await mesh.pid()).values()
            await chaos.crash(app, "s/m/0", "injected")
            exited = await _until(app, LogKind.CHILD_EXITED, "s/m/0")
            assert otpmesh.describe(exited.reason) == "crashed with ChaosCrash: injected"
            await chaos.kill(app, "s/m/1")
            exited = await _until(app, LogKind.CHILD_EXITED, "s/m/1")
            assert "killed by signal 9" in otpmesh.describe(exited.reason)
            await chaos.stop(app, "s/t", "normal")  # transient + normal: not restarted
            await _until(app, LogKind.CHILD_EXITED, "s/t")
            await app.settled()
            assert (await mesh.count()).values() == [1, 1, 1]
            new_pids = (await mesh.pid()).values()
            assert new_pids[0] == pids[0] and new_pids[1] != pids[1]
            with pytest.raises(otpmesh.ActorDiedError, match="will not be restarted"):
                await app.actor("s/t").ping()
            assert _faults(app) == [
                "crash s/m/0 (injected)",
                f"kill s/m/1 (SIGKILL pid {pids[1]})",
                "stop s/t ('normal')",
            ]
            kinds = [str(e.kind) for e in app.events]
            assert kinds.index("fault_injected") < kinds.index("child_exited")

    run_trio(body)


def test_a_hung_process_is_detected_by_heartbeat_and_replaced() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            mesh = app.mesh("s/m")
            pid = await mesh[2].pid()
            await chaos.hang(app, "s/m/2")
            with pytest.raises(otpmesh.CallTimeoutError, match="s/m/2"):
                await mesh[2].ping.with_timeout(0.5)()
            exited = await _until(app, LogKind.CHILD_EXITED, "s/m/2")
            why = otpmesh.describe(exited.reason)
            assert "hung (stopped: no heartbeat for 2 s) and was killed" in why
            assert await mesh[2].pid() != pid

    run_trio(body)


def test_partition_loses_calls_for_a_while_then_heals() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            mesh = app.mesh("s/m")
            # 2 s: the ping below must reach s/m/1 inside the partition, even on a busy machine
            await chaos.partition(app, "s/m/1", 2.0)
            await trio.sleep(0.1)
            with pytest.raises(otpmesh.CallTimeoutError, match="s/m/1"):
                await mesh[1].ping.with_timeout(0.3)()
            assert await mesh[0].ping() == "s/m/0"  # the others are unaffected
            with trio.fail_after(30):  # healed: a ping is answered again
                while True:
                    try:
                        assert await mesh[1].ping.with_timeout(0.5)() == "s/m/1"
                        break
                    except otpmesh.CallTimeoutError:
                        pass
            assert not app.events.of_kind(LogKind.CHILD_EXITED)  # and never restarted

    run_trio(body)


def test_delay_and_drop_affect_messages_to_one_actor_for_a_while() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            mesh = app.mesh("s/m")
            await chaos.delay(app, "s/m/0", 0.3, 5.0)
            start = trio.current_time()
            assert await mesh[0].ping() == "s/m/0"
            assert trio.current_time() - start >= 0.3
            await chaos.drop(app, "s/m/2", 0.5)
            with pytest.raises(otpmesh.CallTimeoutError):
                await mesh[2].ping.with_timeout(0.2)()
            await trio.sleep(0.5)
            assert await mesh[2].ping() == "s/m/2"

    run_trio(body)


def test_fail_starts_makes_the_next_starts_fail_and_counts_against_intensity() -> None:
    tree = Supervisor("s", intensity=5, children=[Worker("w", Member)])

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            chaos.fail_starts(app, "s/w", 2)
            await chaos.crash(app, "s/w")
            await app.settled()
            failed = app.events.of_kind(LogKind.START_FAILED)
            assert len(failed) == 2
            assert otpmesh.describe(failed[0].reason).startswith("crashed with ChaosStartFailure")
            assert await app.actor("s/w").ping() == "s/w"

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_chaos_monkey_schedule_is_reproducible_from_its_seed() -> None:
    tree = Supervisor(
        "s",
        intensity=1000,
        period=1.0,
        children=[
            Mesh("m", Member, shape={"procs": 4}, intensity=1000, period=1.0),
            Worker("x", Member),
        ],
    )

    async def body() -> list[str]:
        async with otpmesh.start(tree, placement="local") as app:
            monkey = chaos.ChaosMonkey(
                app,
                seed=7,
                rate=20.0,
                targets=["s/m/*"],
                faults={"crash": 2, "stop": 1, "kill": 1},
                max_faults=30,
            )
            planned = monkey.schedule(30)
            await monkey.run()
            await app.settled()
            assert [(f.kind, f.path) for f in monkey.injected] == [(k, p) for _, k, p in planned]
            assert {f.path for f in monkey.injected} <= {f"s/m/{r}" for r in range(4)}
            assert (await app.mesh("s/m").ping()).values() == [f"s/m/{r}" for r in range(4)]
            return [str(f) for f in monkey.injected]

    first = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    again = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first == again and len(first) == 30


def test_chaos_monkey_rejects_targets_that_match_nothing() -> None:
    async def body() -> None:
        async with otpmesh.start(
            Supervisor("s", children=[Worker("w", Member)]), placement="local"
        ) as app:
            with pytest.raises(
                ValueError, match=r"no actor of this tree matches targets \['x/\*'\]"
            ):
                chaos.ChaosMonkey(app, targets=["x/*"])
            with pytest.raises(ValueError, match="unknown faults"):
                chaos.ChaosMonkey(app, faults={"meteor": 1})

    trio.run(body)


def test_nothing_is_lost_under_a_monkey_killing_processes() -> None:
    """Every call the controller makes ends — a result or a clear error — and retried
    idempotent calls all get results."""
    tree = Supervisor(
        "s",
        intensity=100,
        period=10.0,
        children=[
            Mesh("m", Member, shape={"procs": 4}, strategy=ONE_FOR_ONE, intensity=100, period=10.0)
        ],
    )
    clear = (otpmesh.ActorError, otpmesh.ActorDiedError, otpmesh.CallTimeoutError)
    faults = 16  # a count, not a duration: the same faults however slow the machine is

    async def body() -> None:
        outcomes: dict[str, int] = {"result": 0, "error": 0, "retried_result": 0}
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/m").with_timeout(5.0)
            monkey = chaos.ChaosMonkey(
                app,
                seed=11,
                rate=6.0,
                targets=["s/m/*"],
                faults={"kill": 2, "crash": 1},
                max_faults=faults,
            )

            async def caller(rank: int) -> None:
                # Calls are in flight from before the first fault (a kill) until after the last.
                while len(monkey.injected) < faults:
                    try:
                        await mesh[rank].nap(0.01)
                        outcomes["result"] += 1
                    except clear:
                        outcomes["error"] += 1
                        await otpmesh.retry(mesh[rank].nap, 0.01, attempts=20)
                        outcomes["retried_result"] += 1

            with trio.fail_after(60):  # nothing hangs
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(monkey.run)
                    for rank in range(4):
                        nursery.start_soon(caller, rank)
            await app.settled()
            assert len(monkey.injected) == faults
            assert outcomes["error"] >= 1  # the monkey did hit calls in flight
            assert outcomes["retried_result"] == outcomes["error"]
            assert (await mesh.ping()).values() == [f"s/m/{r}" for r in range(4)]

    run_trio(body, timeout=90)


# ---- chaos.kill at a supervisor's path: OTP's exit(Sup, kill) -----------------------------------


def test_killing_a_supervisor_kills_all_under_it_at_once_and_its_parent_restarts_it() -> None:
    """chaos.kill at a supervisor's path: no orderly stop (no child_terminated, no on_stop),
    the supervisor exits 'killed' and its parent (one_for_one) restarts it, static children in
    order. Compare chaos.stop's sequence in tests/test_fault_plan.py."""
    tree = Supervisor(
        "s",
        intensity=5,
        children=[
            Worker("w", Member),
            Supervisor(
                "sub",
                children=[Worker("a", Member), Supervisor("deep", children=[Worker("b", Member)])],
            ),
        ],
    )

    async def body() -> list[str]:
        async with otpmesh.start(tree, placement="local") as app:
            await trio.sleep(1.0)  # MockClock: what follows is told apart by its time
            actors.JOURNAL.clear()
            fault = await chaos.kill(app, "s/sub")
            assert fault.hit and str(fault) == "kill s/sub (the supervisor and everything under it)"
            await app.settled()
            assert await app.actor("s/sub/deep/b").ping() == "s/sub/deep/b"
            assert [what for _, what, _ in actors.JOURNAL if what == "on_stop"] == []
            return [str(e) for e in app.events if e.time > 0]

    seen = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [" ".join(line.split()) for line in seen] == [
        "fault_injected s/sub (kill s/sub (the supervisor and everything under it))",
        "child_exited s/sub #1 (killed)",
        "child_started s/sub/a #2",
        "child_started s/sub/deep/b #2",
        "supervisor_started s/sub/deep",
        "child_started s/sub/deep #2",
        "supervisor_started s/sub",
        "child_started s/sub #2",
    ]


def test_killing_a_mesh_under_one_for_all_stops_its_siblings_in_order_then_restarts_all() -> None:
    tree = Supervisor(
        "s",
        strategy=otpmesh.ONE_FOR_ALL,
        intensity=5,
        children=[Worker("w", Member), Mesh("m", Member, shape={"procs": 2}), Worker("x", Member)],
    )

    async def body() -> list[str]:
        async with otpmesh.start(tree, placement="local") as app:
            await trio.sleep(1.0)
            await chaos.kill(app, "s/m")
            await app.settled()
            assert (await app.mesh("s/m").ping()).values() == ["s/m/0", "s/m/1"]
            return [str(e) for e in app.events if e.time > 0]

    seen = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [" ".join(line.split()) for line in seen] == [
        "fault_injected s/m (kill s/m (the supervisor and everything under it))",
        "child_exited s/m #1 (killed)",
        "child_terminated s/x #1 (stopped (shutdown))",
        "child_terminated s/w #1 (stopped (shutdown))",
        "child_started s/w #2",
        "child_started s/m/0 #2",
        "child_started s/m/1 #2",
        "supervisor_started s/m",
        "child_started s/m #2",
        "child_started s/x #2",
    ]


def test_killing_the_root_supervisor_ends_the_app_with_a_supervisor_error() -> None:
    async def body() -> None:
        with pytest.raises(otpmesh.SupervisorError, match="supervisor s exited: killed"):
            root = Supervisor("s", children=[Worker("w", Member)])
            async with otpmesh.start(root, placement="local") as app:
                await chaos.kill(app, "s")
                await trio.sleep_forever()

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_killing_a_mesh_of_worker_processes_restarts_it() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            await chaos.kill(app, "s/m")
            await app.settled()
            assert (await app.mesh("s/m").ping()).values() == ["s/m/0", "s/m/1", "s/m/2"]
            exits = [(e.child_path, e.reason) for e in app.events.of_kind(LogKind.CHILD_EXITED)]
            assert exits == [("s/m", "killed")]
            assert [e.incarnation for e in app.events.of_kind(LogKind.CHILD_STARTED)][-1] == 2

    run_trio(body)
