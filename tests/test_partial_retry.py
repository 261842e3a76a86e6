"""Partial retry of a broadcast (``Endpoint.with_retry(lost=...)``): the member whose call was
lost with its actor (delivered, then SIGKILLed) gets its call again on the next incarnation;
the other members' results are kept and their endpoints never run twice. Real worker
processes and a real SIGKILL; the kill lands while the victim is inside the call (the actor
says so through a file before it blocks), never after a sleep."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, Mesh, Supervisor, chaos
from otpmesh._node._lost import LostRetry
from otpmesh._node._slot import Slot
from tests.conftest import run_trio
from tests.lost_actors import Tally

VICTIM, MEMBERS = 2, 4


def _tree(journal: Path, blocks: int = 1) -> Supervisor:
    return Supervisor(
        "s",
        children=[
            Mesh(
                "m",
                Tally,
                shape={"procs": MEMBERS},
                strategy=ONE_FOR_ONE,
                intensity=10,
                period=10.0,
                args=(str(journal), VICTIM, blocks),
            )
        ],
    )


async def _held(journal: Path, n: int) -> None:
    """Wait until the victim's incarnation `n` is inside the call (it wrote the file)."""
    while not journal.with_name(f"{journal.name}.held.{n}").exists():
        await trio.sleep(0.01)


def _journal(journal: Path) -> list[tuple[int, int]]:
    return [
        (int(r), int(p))
        for r, p in (line.split() for line in journal.read_text().split("\n") if line)
    ]


async def _call_killing(
    app: otpmesh.App, ep: otpmesh.Endpoint, journal: Path, kills: int
) -> otpmesh.ValueMesh[dict[str, int]] | BaseException:
    """Call `ep` on the mesh; SIGKILL the victim each time it is inside the call, `kills` times;
    return the call's result or its error (as soon as it has one)."""
    outcome: list[otpmesh.ValueMesh[dict[str, int]] | BaseException] = []

    async def call() -> None:
        try:
            outcome.append(await ep.call(7))
        except otpmesh.OtpmeshError as err:
            outcome.append(err)
        nursery.cancel_scope.cancel()  # done: no more kills to wait for

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        for n in range(1, kills + 1):
            await _held(journal, n)
            await chaos.kill(app, f"s/m/{VICTIM}")
    return outcome[0]


@pytest.mark.timeout(90)
def test_lost_member_is_called_again_on_its_next_incarnation_and_the_others_run_once(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"

    async def body() -> None:
        async with otpmesh.start(_tree(journal)) as app:
            mesh = app.mesh("s/m").with_timeout(60)
            before = [r["pid"] for r in (await mesh.ran()).values()]
            # with_timeout keeps the retry (and with_retry the timeout: the next test).
            work = mesh.work.with_retry(lost=1).with_timeout(60)
            result = await _call_killing(app, work, journal, kills=1)
            assert isinstance(result, otpmesh.ValueMesh), result
            values = result.values()
            assert [v["value"] for v in values] == [70 + rank for rank in range(MEMBERS)]
            after = [r["pid"] for r in (await mesh.ran()).values()]
            # The victim's answer came from its next incarnation, the others' from the first.
            assert values[VICTIM]["pid"] == after[VICTIM] != before[VICTIM]
            assert [v["pid"] for i, v in enumerate(values) if i != VICTIM] == [
                p for i, p in enumerate(before) if i != VICTIM
            ]
            # Counted in the actors: every live incarnation ran the endpoint exactly once ...
            assert [r["runs"] for r in (await mesh.ran()).values()] == [1] * MEMBERS
            # ... and across incarnations only the victim ran it twice (once lost).
            ran = _journal(journal)
            assert sorted(rank for rank, _ in ran) == [0, 1, 2, 2, 3]
            assert (VICTIM, before[VICTIM]) in ran and (VICTIM, after[VICTIM]) in ran

    run_trio(body, timeout=80)


@pytest.mark.timeout(90)
def test_without_the_retry_a_lost_call_reports_the_death_as_before(tmp_path: Path) -> None:
    journal = tmp_path / "journal"

    async def body() -> None:
        async with otpmesh.start(_tree(journal)) as app:
            mesh = app.mesh("s/m").with_timeout(60)
            error = await _call_killing(app, mesh.work, journal, kills=1)
            with pytest.raises(otpmesh.ActorDiedError, match=f"s/m/{VICTIM} is dead") as died:
                raise error
            assert died.value.delivered
            assert sorted(rank for rank, _ in _journal(journal)) == [0, 1, 2, 3]  # not resent

    run_trio(body, timeout=80)


@pytest.mark.timeout(90)
def test_a_member_lost_more_often_than_allowed_reports_its_last_death(tmp_path: Path) -> None:
    journal = tmp_path / "journal"

    async def body() -> None:
        async with otpmesh.start(_tree(journal, blocks=2)) as app:
            mesh = app.mesh("s/m").with_timeout(60)
            error = await _call_killing(app, mesh.work.with_retry(lost=1), journal, kills=2)
            with pytest.raises(otpmesh.ActorDiedError, match=f"s/m/{VICTIM} is dead"):
                raise error
            ran = sorted(rank for rank, _ in _journal(journal))
            assert ran == [0, 1, 2, 2, 3]  # sent once more, then given up

    run_trio(body, timeout=80)


@pytest.mark.timeout(90)
def test_with_retry_keeps_the_endpoints_timeout(tmp_path: Path) -> None:
    journal = tmp_path / "journal"

    async def body() -> None:
        async with otpmesh.start(_tree(journal)) as app:
            victim = app.actor(f"s/m/{VICTIM}")
            with pytest.raises(otpmesh.CallTimeoutError, match=f"s/m/{VICTIM}"):
                await victim.work.with_timeout(1.0).with_retry(lost=1)(7)  # blocks for ever

    run_trio(body, timeout=80)


def test_with_retry_takes_a_whole_number_of_resends() -> None:
    with pytest.raises(ValueError, match=r"a whole number >= 0, not -1: e\.g\. ep\.with_retry"):
        LostRetry(-1)
    with pytest.raises(ValueError, match="not True"):
        LostRetry(True)  # type: ignore[arg-type]


def test_only_a_delivered_call_to_a_supervised_actor_that_will_come_back_is_resent() -> None:
    lost = otpmesh.ActorDiedError("m/0", "killed")
    unsent = otpmesh.ActorDiedError("m/0", "restarting", delivered=False)
    supervised = Slot("m/0", "addr", supervised=True)
    budget = LostRetry(1).budget(1)
    assert not budget.take(0, Slot("m/0", "addr"), lost)  # unsupervised: nothing restarts it
    assert not budget.take(0, supervised, unsent)  # the gather resends those anyway
    assert not budget.take(0, supervised, otpmesh.ActorError("m/0", "ValueError", "x", ""))
    gone = Slot("m/0", "addr", supervised=True)
    gone.mark_gone("its supervisor gave up")
    assert not budget.take(0, gone, lost)
    assert budget.take(0, supervised, lost)
    assert not budget.take(0, supervised, lost)  # its one re-send is spent
