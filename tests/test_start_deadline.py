"""Every start has a deadline: a constructor or ``on_start`` that hangs is a hang like any
other (real worker processes, real heartbeats). Before, ``otpmesh.start(tree)`` and
``procs.spawn(...)`` waited for ever and logged nothing, even with a ``progress_deadline``:
the heartbeat beats through ``time.sleep``, so no silence rule fired."""

from __future__ import annotations

from pathlib import Path

import pytest

import otpmesh
from otpmesh import Supervisor, SupervisorError, Worker
from tests.conftest import run_trio
from tests.starting_actors import HangsOnceInOnStart, Pid, ProgressesForEver, SleepsInInit


def _start_error(actor: type[otpmesh.Actor], **spec: float) -> str:
    async def body() -> str:
        tree = Supervisor("app", intensity=0, children=[Worker("w", actor, **spec)])
        with pytest.raises(SupervisorError) as failed:
            async with otpmesh.start(tree):
                pass
        return str(failed.value)

    return str(run_trio(body))


@pytest.mark.timeout(60)
def test_a_constructor_stuck_in_sleep_fails_its_start_as_hung_at_its_progress_deadline() -> None:
    said = _start_error(SleepsInInit, progress_deadline=1.0)
    assert "child w failed to start (hung in __init__: no progress for" in said
    assert "ran past its progress deadline while starting; its process was killed" in said
    assert "at __init__ (" in said and "starting_actors.py" in said  # where it was stuck


@pytest.mark.timeout(60)
def test_a_start_that_keeps_saying_progress_still_ends_at_its_start_timeout() -> None:
    # Its progress deadline far above its beat (0.05 s), so a starved thread on a loaded
    # machine cannot make it the one that fires: only the start timeout may.
    said = _start_error(ProgressesForEver, progress_deadline=30.0, start_timeout=1.5)
    assert "did not start within its start_timeout" in said


@pytest.mark.timeout(60)
def test_a_restart_whose_on_start_hangs_is_cancelled_and_retried_in_the_same_process(
    tmp_path: Path,
) -> None:
    """An async ``on_start`` is cancelled at its deadline, not its process: the restart fails
    as hung (an event with its stack), the supervisor tries again as OTP does, and the actor
    serves from the same process."""
    marker = tmp_path / "hang"

    async def body() -> tuple[int, int, list[str]]:
        worker = Worker("w", HangsOnceInOnStart, args=(str(marker),), start_timeout=1.0)
        tree = Supervisor("app", intensity=5, period=60.0, children=[worker])
        async with otpmesh.start(tree) as app:
            actor = app.actor("app/w")
            before = await actor.pid()
            marker.touch()
            with pytest.raises(otpmesh.ActorError, match="crashed on purpose"):
                await actor.crash()
            await app.settled()
            after = await actor.pid()
            failed = [str(e.reason) for e in app.events.of_kind("start_failed")]
            return before, after, failed

    before, after, failed = run_trio(body)
    assert before == after
    assert not marker.exists()
    assert len(failed) == 1 and "hung in __init__" in failed[0], failed
    assert "did not start within its start_timeout" in failed[0]
    assert "at on_start (" in failed[0]


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), True, "600"])
def test_start_timeout_must_be_none_or_a_positive_number_of_seconds(value: object) -> None:
    with pytest.raises(otpmesh.SpecError, match="start_timeout"):
        Worker("w", Pid, start_timeout=value)  # type: ignore[arg-type]


def test_the_default_start_timeout_leaves_time_to_load_a_large_model() -> None:
    assert Worker("w", Pid).start_timeout == 600.0
    assert otpmesh.Mesh("m", Pid).as_supervisor().children[0].start_timeout == 600.0  # type: ignore[union-attr]
    assert Worker("w", Pid, start_timeout=None).start_timeout is None
