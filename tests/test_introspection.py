"""OTP-style introspection of a running tree: which_children and count_children."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import ChildStatus, Mesh, Supervisor, Worker, chaos
from tests.actors import Member

TREE = Supervisor(
    "s",
    intensity=10,
    children=[
        Worker("a", Member),
        Mesh("m", Member, shape={"procs": 2}),
        Supervisor("sub", children=[Worker("b", Member)]),
    ],
)


def _run(body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with otpmesh.start(TREE, placement="local") as app:
            await body(app)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_which_children_lists_newest_first_with_status_type_and_incarnation() -> None:
    async def body(app: otpmesh.App) -> None:
        rows = [(c.id, c.status, c.type, c.incarnation) for c in app.which_children("s")]
        assert rows == [
            ("sub", ChildStatus.RUNNING, "supervisor", 1),
            ("m", ChildStatus.RUNNING, "supervisor", 1),
            ("a", ChildStatus.RUNNING, "worker", 1),
        ]
        assert [(c.id, c.type) for c in app.which_children("s/m")] == [
            ("1", "worker"),
            ("0", "worker"),
        ]
        await chaos.crash(app, "s/a")
        await app.settled()
        assert app.which_children("s")[-1].incarnation == 2  # restarted
        await app.terminate_child("s/a")
        assert app.which_children("s")[-1].status is ChildStatus.UNDEFINED

    _run(body)


def test_count_children_counts_specs_active_supervisors_and_workers() -> None:
    async def body(app: otpmesh.App) -> None:
        assert app.count_children("s") == {"specs": 3, "active": 3, "supervisors": 2, "workers": 1}
        await app.terminate_child("s/sub")
        assert app.count_children("s") == {"specs": 3, "active": 2, "supervisors": 2, "workers": 1}
        assert app.count_children("s/m") == {
            "specs": 2,
            "active": 2,
            "supervisors": 0,
            "workers": 2,
        }

    _run(body)


def test_introspecting_a_path_that_is_no_running_supervisor_says_so() -> None:
    async def body(app: otpmesh.App) -> None:
        with pytest.raises(KeyError, match="no running supervisor at 's/a'"):
            app.which_children("s/a")
        await app.terminate_child("s/sub")
        with pytest.raises(KeyError, match="no running supervisor at 's/sub'"):
            app.count_children("s/sub")

    _run(body)


def test_a_child_added_with_start_child_is_supervised_over_processes_too() -> None:
    """Its exits reach its supervisor (they were once only logged): it is restarted."""
    from tests.conftest import run_trio

    async def body() -> None:
        tree = Supervisor("s", intensity=5, children=[Worker("a", Member)])
        async with otpmesh.start(tree) as app:
            await app.start_child("s", Worker("b", Member))
            with pytest.raises(otpmesh.ActorError):
                await app.actor("s/b").crash("boom")
            await app.settled()
            assert await otpmesh.retry(app.actor("s/b").ping) == "s/b"
            assert [(c.id, c.incarnation) for c in app.which_children("s")] == [("b", 2), ("a", 1)]

    run_trio(body, timeout=60)
