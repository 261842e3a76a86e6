"""Running trees through the trio driver, in-process (placement="local") under MockClock.

The same rules run over real worker processes in test_app_procs.py.
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import (
    BRUTAL_KILL,
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    LogKind,
    Mesh,
    Supervisor,
    Worker,
)
from tests import actors
from tests.actors import FailsToStart, Ignores, Member


def run_local(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run under MockClock: restart windows and shutdown timeouts take no real time."""
    actors.JOURNAL.clear()

    # No trio deadline here: under autojump a deadline passes whenever all tasks wait. The
    # wall-clock limit is pytest-timeout's (pyproject.toml).
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def kinds(app: otpmesh.App, *wanted: str) -> list[tuple[str, str, int | None]]:
    return [(str(e.kind), e.child_path, e.incarnation) for e in app.events if e.kind in wanted]


def start(tree: Supervisor | Mesh, **kw: Any) -> Any:
    return otpmesh.start(tree, placement="local", **kw)


def test_children_start_in_order_and_stop_in_reverse_order() -> None:
    tree = Supervisor(
        "root",
        children=[Worker("a", Member), Worker("b", Member), Mesh("m", Member, shape={"procs": 2})],
    )

    async def body() -> None:
        async with start(tree) as app:
            assert await app.actor("root/b").ping() == "root/b"
        inits = [p for p, what, _ in actors.JOURNAL if what == "init"]
        stops = [(p, r) for p, what, r in actors.JOURNAL if what == "on_stop"]
        assert inits == ["root/a", "root/b", "root/m/0", "root/m/1"]
        # The mesh first, its members all at once (in no defined order), then b, then a.
        assert sorted(stops[:2]) == [("root/m/0", "shutdown"), ("root/m/1", "shutdown")]
        assert stops[2:] == [("root/b", "shutdown"), ("root/a", "shutdown")]

    run_local(body)


def test_one_for_one_restarts_only_the_crashed_child_and_refs_follow() -> None:
    tree = Supervisor(
        "root",
        strategy=ONE_FOR_ONE,
        intensity=3,
        children=[Worker("a", Member), Worker("b", Member)],
    )

    async def body() -> None:
        async with start(tree) as app:
            a, b = app.actor("root/a"), app.actor("root/b")
            assert await b.count() == 1
            with pytest.raises(otpmesh.ActorError, match=r"RuntimeError: on purpose"):
                await a.crash()
            await app.settled()
            assert await a.count() == 1  # a fresh incarnation
            assert await b.count() == 2  # untouched
            assert kinds(app, "child_exited", "child_started")[-2:] == [
                ("child_exited", "root/a", 1),
                ("child_started", "root/a", 2),
            ]

    run_local(body)


def test_rest_for_one_restarts_later_siblings_in_start_order() -> None:
    tree = Supervisor(
        "root",
        strategy=REST_FOR_ONE,
        intensity=3,
        children=[Worker("a", Member), Worker("b", Member), Worker("c", Member)],
    )

    async def body() -> None:
        async with start(tree) as app:
            with pytest.raises(otpmesh.ActorError):
                await app.actor("root/b").crash()
            await app.settled()
            tail = kinds(app, "child_exited", "child_terminated", "child_started")[-4:]
            assert tail == [
                ("child_exited", "root/b", 1),
                ("child_terminated", "root/c", 1),
                ("child_started", "root/b", 2),
                ("child_started", "root/c", 2),
            ]

    run_local(body)


def test_one_for_all_mesh_restarts_every_slot_as_one_restart() -> None:
    tree = Supervisor(
        "root",
        intensity=1,
        children=[Mesh("dp", Member, shape={"gpus": 3}, strategy=ONE_FOR_ALL, intensity=1)],
    )

    async def body() -> None:
        async with start(tree) as app:
            dp = app.mesh("root/dp")
            with pytest.raises(otpmesh.ActorError):
                await dp[1].crash()
            await app.settled()
            assert (await dp.count()).values() == [1, 1, 1]
            started = kinds(app, "child_started")
            assert started[-3:] == [("child_started", f"root/dp/{r}", 2) for r in range(3)]

    run_local(body)


def test_a_group_that_gives_up_is_a_failure_its_parent_handles() -> None:
    tree = Supervisor(
        "root",
        intensity=10,
        children=[Mesh("rollouts", Member, shape={"procs": 2}, intensity=2, period=5.0)],
    )

    async def body() -> None:
        async with start(tree) as app:
            mesh = app.mesh("root/rollouts")
            for _ in range(3):
                with pytest.raises(otpmesh.ActorError):
                    await mesh[0].crash()
                await app.settled()
            reached = app.events.of_kind(LogKind.RESTART_INTENSITY_REACHED)
            assert [e.path for e in reached] == ["root/rollouts"]
            assert ("child_exited", "root/rollouts", 1) in kinds(app, "child_exited")
            assert (await mesh.count()).values() == [1, 1]  # the group came back whole

    run_local(body)


def test_root_that_gives_up_raises_with_path_and_last_reasons() -> None:
    tree = Supervisor("root", intensity=1, period=5.0, children=[Worker("w", Member)])

    async def body() -> None:
        with pytest.raises(otpmesh.SupervisorError) as info:
            async with start(tree) as app:
                w = app.actor("root/w")
                with pytest.raises(otpmesh.ActorError):
                    await w.crash("first")
                await app.settled()
                with pytest.raises(otpmesh.ActorError):
                    await w.crash("second")
                await trio.sleep_forever()  # cancelled when the root gives up
        message = str(info.value)
        assert "supervisor root reached its restart intensity (1 restarts in 5.0 s)" in message
        assert "root/w crashed with RuntimeError: second" in message

    run_local(body)


def test_restarts_outside_the_period_do_not_add_up() -> None:
    tree = Supervisor("root", intensity=1, period=5.0, children=[Worker("w", Member)])

    async def body() -> None:
        async with start(tree) as app:
            w = app.actor("root/w")
            for _ in range(4):
                with pytest.raises(otpmesh.ActorError):
                    await w.crash()
                await app.settled()
                await trio.sleep(5.5)  # MockClock: instant
            assert await w.ping() == "root/w"
            assert [e.incarnation for e in app.events.of_kind(LogKind.CHILD_STARTED)] == [
                1,
                2,
                3,
                4,
                5,
            ]
            assert not app.events.of_kind(LogKind.RESTART_INTENSITY_REACHED)

    run_local(body)


def test_transient_child_is_not_restarted_after_a_normal_exit_and_calls_fail_fast() -> None:
    tree = Supervisor(
        "root", children=[Worker("t", Member, restart=TRANSIENT), Worker("p", Member)]
    )

    async def body() -> None:
        async with start(tree) as app:
            t = app.actor("root/t")
            assert await t.quit("normal") == "bye"
            await app.settled()
            with pytest.raises(
                otpmesh.ActorDiedError,
                match=r"root/t is dead: it is not running and will not be restarted "
                r"\(last exit: stopped \(normal\)\)",
            ):
                await t.ping()
            assert await app.restart_child("root/t") == otpmesh.Outcome.OK
            assert await t.ping() == "root/t"
            await t.quit(("shutdown", "done"))
            await app.settled()
            assert kinds(app, "child_started").count(("child_started", "root/t", 3)) == 0

    run_local(body)


def test_transient_child_is_restarted_after_a_crash_and_temporary_never() -> None:
    tree = Supervisor(
        "root",
        intensity=5,
        children=[Worker("t", Member, restart=TRANSIENT), Worker("tmp", Member, restart=TEMPORARY)],
    )

    async def body() -> None:
        async with start(tree) as app:
            with pytest.raises(otpmesh.ActorError):
                await app.actor("root/t").crash()
            with pytest.raises(otpmesh.ActorError):
                await app.actor("root/tmp").crash()
            await app.settled()
            assert await app.actor("root/t").ping() == "root/t"
            with pytest.raises(otpmesh.ActorDiedError):
                await app.actor("root/tmp").ping()
            with pytest.raises(otpmesh.ChildError, match="not_found"):
                await app.restart_child("root/tmp")

    run_local(body)


def test_initial_start_failure_stops_started_siblings_and_fails_the_start() -> None:
    tree = Supervisor(
        "root", children=[Worker("a", Member), Worker("bad", FailsToStart), Worker("never", Member)]
    )

    async def body() -> None:
        with pytest.raises(
            otpmesh.SupervisorError,
            match=r"root failed to start: child bad failed to start "
            r"\(crashed with RuntimeError: cannot start",
        ):
            async with start(tree):
                pass
        assert [(p, w) for p, w, _ in actors.JOURNAL] == [("root/a", "init"), ("root/a", "on_stop")]

    run_local(body)


def test_ignore_keeps_the_spec_without_running_it() -> None:
    tree = Supervisor("root", children=[Worker("i", Ignores), Worker("a", Member)])

    async def body() -> None:
        async with start(tree) as app:
            assert kinds(app, "start_ignored") == [("start_ignored", "root/i", 1)]
            with pytest.raises(otpmesh.ActorDiedError, match="not running"):
                await app.actor("root/i").ping()
            assert await app.restart_child("root/i") == otpmesh.Outcome.IGNORED

    run_local(body)


def test_shutdown_timeout_kills_a_slow_stop_hook() -> None:
    tree = Supervisor(
        "root",
        children=[
            Worker("slow", Member, kwargs={"stop_delay": 100.0}, shutdown=2.0),
            Worker("brutal", Member, kwargs={"stop_delay": 100.0}, shutdown=BRUTAL_KILL),
        ],
    )

    async def body() -> None:
        async with start(tree) as app:
            started = trio.current_time()
        took = trio.current_time() - started
        terminated = {e.child_path: e.reason for e in app.events.of_kind(LogKind.CHILD_TERMINATED)}
        assert terminated == {"root/brutal": "killed", "root/slow": "killed"}
        assert 2.0 <= took < 3.0  # waited the slow child's 2 s, not its 100 s stop hook
        hooks = [p for p, what, _ in actors.JOURNAL if what == "on_stop"]
        assert hooks == ["root/slow"]  # brutal_kill skips the hook

    run_local(body)


def test_a_call_made_while_the_target_restarts_waits_for_the_new_incarnation() -> None:
    tree = Supervisor(
        "root",
        strategy=ONE_FOR_ALL,
        intensity=5,
        children=[Worker("a", Member), Worker("b", Member, kwargs={"stop_delay": 3.0})],
    )

    async def body() -> None:
        async with start(tree) as app:
            a, b = app.actor("root/a"), app.actor("root/b")
            assert await b.count() == 1
            with pytest.raises(otpmesh.ActorError):
                await a.crash()
            await trio.sleep(1.0)  # b is inside its 3 s stop hook now
            assert await b.count() == 1  # waited for b's next incarnation
            await app.settled()
            assert ("child_started", "root/b", 2) in kinds(app, "child_started")
            with pytest.raises(otpmesh.ActorError):
                await a.crash()
            await trio.sleep(1.0)
            with pytest.raises(otpmesh.CallTimeoutError, match="root/b"):
                await b.count.with_timeout(1.0)()

    run_local(body)


def test_dynamic_children_follow_otp_outcomes() -> None:
    tree = Supervisor("root", children=[Worker("a", Member)])

    async def body() -> None:
        async with start(tree) as app:
            assert await app.start_child("root", Worker("b", Member)) == otpmesh.Outcome.OK
            assert await app.actor("root/b").ping() == "root/b"
            with pytest.raises(otpmesh.ChildError, match="root/b: already_started"):
                await app.start_child("root", Worker("b", Member))
            with pytest.raises(otpmesh.ChildError, match="root/b: running"):
                await app.delete_child("root/b")
            assert await app.terminate_child("root/b") == otpmesh.Outcome.OK
            with pytest.raises(otpmesh.ActorDiedError):
                await app.actor("root/b").ping()
            with pytest.raises(otpmesh.ChildError, match="already_present"):
                await app.start_child("root", Worker("b", Member))
            assert await app.restart_child("root/b") == otpmesh.Outcome.OK
            assert await app.actor("root/b").ping() == "root/b"
            await app.terminate_child("root/b")
            assert await app.delete_child("root/b") == otpmesh.Outcome.OK
            with pytest.raises(otpmesh.ChildError, match="not_found"):
                await app.terminate_child("root/b")
            significant = Worker("s", Member, significant=True, restart=TRANSIENT)
            with pytest.raises(otpmesh.ChildError, match=r"invalid_spec.*auto_shutdown"):
                await app.start_child("root", significant)

    run_local(body)


def test_event_log_is_a_list_a_subscription_and_a_jsonl_file() -> None:
    tree = Supervisor("root", intensity=3, children=[Worker("a", Member)])
    sink = io.StringIO()

    async def body() -> None:
        seen: list[str] = []
        async with start(tree, events_file=sink) as app:
            async with trio.open_nursery() as nursery:

                async def follow() -> None:
                    async for entry in app.events.subscribe():
                        seen.append(f"{entry.kind} {entry.child_path}")
                        if entry.kind == "child_started" and entry.incarnation == 2:
                            return

                nursery.start_soon(follow)
                await trio.sleep(0)
                with pytest.raises(otpmesh.ActorError):
                    await app.actor("root/a").crash()
        assert seen == ["child_exited root/a", "child_started root/a"]
        lines = [json.loads(line) for line in sink.getvalue().splitlines()]
        assert [line["kind"] for line in lines] == [str(e.kind) for e in app.events]
        exited = next(line for line in lines if line["kind"] == "child_exited")
        assert exited["reason"] == "crashed with RuntimeError: on purpose"
        assert exited["incarnation"] == 1

    run_local(body)


def test_an_event_reads_as_one_line() -> None:
    entry = otpmesh.LogEntry(
        1.0, LogKind.CHILD_EXITED, "rl/rollouts", "2", 3, otpmesh.ActorCrash("ValueError", "bad")
    )
    assert str(entry) == (
        "child_exited              rl/rollouts/2 #3  (crashed with ValueError: bad)"
    )


def test_the_error_blames_the_supervisor_that_stopped_the_root_with_its_own_exits() -> None:
    """A nested supervisor gives up first; its parent restarts it until the parent's own
    intensity is reached: the error names the parent, and the parent's child exits."""
    inner = Supervisor("inner", intensity=0, children=[Worker("w", Member)])
    tree = Supervisor("root", intensity=1, period=5.0, children=[inner])

    async def body() -> None:
        with pytest.raises(otpmesh.SupervisorError) as info:
            async with start(tree) as app:
                for _ in range(2):
                    with pytest.raises(otpmesh.ActorError):
                        await app.actor("root/inner/w").crash("boom")
                    await app.settled()
                await trio.sleep_forever()  # cancelled when the root gives up
        assert str(info.value) == (
            "supervisor root reached its restart intensity (1 restarts in 5.0 s); last exits: "
            "root/inner stopped (shutdown), 2 times"
        )  # not root/inner, whose intensity (0) was reached first, nor its child's crashes

    run_local(body)
