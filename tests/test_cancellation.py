"""Cancellation reaches the actor: a caller that gives up (timeout, cancelled task) cancels the
async endpoint it was waiting on, whose `finally` runs; the actor then serves the next call."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import Mesh, Supervisor, Worker, chaos
from tests.actors import Waiter
from tests.conftest import run_trio
from tests.hang_actors import Relayer


async def _journal_has(journal: Path, line: str) -> None:
    while not (journal.exists() and line in journal.read_text().splitlines()):
        await trio.sleep(0.02)


@pytest.mark.parametrize("placement", ["procs", "local"])
def test_a_caller_timeout_cancels_the_async_endpoint(tmp_path: Path, placement: str) -> None:
    journal = tmp_path / "journal"
    tree = Supervisor("s", children=[Worker("w", Waiter, args=(str(journal),))])

    async def body() -> None:
        async with otpmesh.start(tree, placement=placement) as app:  # type: ignore[arg-type]
            waiter = app.actor("s/w")
            with pytest.raises(otpmesh.CallTimeoutError):
                await waiter.with_timeout(0.5).wait_forever("first")
            with trio.fail_after(30):  # a guard: without cancellation it never comes
                await _journal_has(journal, "finally first")
            assert await waiter.ping() == "pong"  # not wedged: the next call is served
            assert not app.events.of_kind(otpmesh.LogKind.CHILD_EXITED)  # and not a crash

    run_trio(body, timeout=60)


def test_a_cancelled_caller_task_cancels_its_calls_running_or_queued(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    tree = Supervisor("s", children=[Worker("w", Waiter, args=(str(journal),))])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            waiter = app.actor("s/w")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter.wait_forever, "running")
                with trio.fail_after(30):
                    await _journal_has(journal, "started running")
                nursery.start_soon(waiter.wait_forever, "queued")  # waits in the mailbox
                await trio.sleep(0.2)  # let it reach the actor's mailbox (either way is fine)
                nursery.cancel_scope.cancel()
            with trio.fail_after(30):
                await _journal_has(journal, "finally running")
            assert await waiter.ping() == "pong"  # nothing left running ahead of it
            lines = journal.read_text().splitlines()
            # The queued call was skipped, or (its cancel came once it had started) cancelled.
            assert "started queued" not in lines or "finally queued" in lines, lines

    run_trio(body, timeout=60)


def test_a_caller_timeout_cancels_calls_relayed_through_a_host_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two actors on one agent host: the broadcast goes to the agent once (a fanout) and the agent
    # relays it; the caller's CANCEL follows the same way, under the agent's own call ids.
    monkeypatch.setenv("OTPMESH_SECRET", "test-cluster-secret")
    journal = tmp_path / "journal"
    tree = Mesh("m", Waiter, shape={"hosts": 1, "procs": 2}, args=(str(journal),))

    async def body() -> None:
        async with otpmesh.cluster(otpmesh.launchers.Local(hosts=1)), otpmesh.start(tree) as app:
            mesh = app.mesh("m")
            with pytest.raises(otpmesh.CallTimeoutError):
                await mesh.with_timeout(1.0).wait_forever("relayed")
            with trio.fail_after(30):  # a guard: without the relayed cancel it never comes
                while journal.read_text().splitlines().count("finally relayed") < 2:
                    await trio.sleep(0.02)
            assert (await mesh.ping()).values() == ["pong", "pong"]  # both serve on
            assert not app.events.of_kind(otpmesh.LogKind.CHILD_EXITED)

    run_trio(body, timeout=60)


def test_a_callers_death_cancels_the_call_it_was_waiting_on(tmp_path: Path) -> None:
    # s/a calls s/b from inside an endpoint; a's process is SIGKILLed: b's endpoint has no one
    # left to answer and is cancelled (no stale chain through the dead caller lingers).
    journal = tmp_path / "journal"
    tree = Supervisor(
        "s", children=[Worker("a", Relayer), Worker("b", Waiter, args=(str(journal),))]
    )

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            b = app.actor("s/b")

            async def forward() -> None:
                with contextlib.suppress(otpmesh.ActorDiedError):
                    await app.actor("s/a").forward(b, "orphan")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(forward)
                with trio.fail_after(30):
                    await _journal_has(journal, "started orphan")
                await chaos.kill(app, "s/a")
                with trio.fail_after(30):  # a guard: without it, b waits for ever
                    await _journal_has(journal, "finally orphan")
            assert await b.ping() == "pong"
            [exit_] = app.events.of_kind(otpmesh.LogKind.CHILD_EXITED)
            assert exit_.child_path == "s/a"  # b was not restarted: cancelled, not crashed

    run_trio(body, timeout=60)
