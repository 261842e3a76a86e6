"""A retried stream never repeats itself: ``otpmesh.retry`` tries a streamed call again only
before its first item reached the caller's receiver (a real SIGKILL mid-stream). Before, the
retried request's first items arrived twice, with nothing to tell them apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import Supervisor, Worker
from tests.conftest import run_trio
from tests.router_actors import Streamer


async def _drain(receiver: otpmesh.PortReceiver[int]) -> list[int]:
    got: list[int] = []
    with trio.move_on_after(1.0):  # whatever is still on its way
        async for value in receiver:
            got.append(value)
    return got


@pytest.mark.timeout(60)
def test_a_stream_that_died_after_its_first_items_is_not_retried(tmp_path: Path) -> None:
    async def body() -> tuple[str, list[int]]:
        tree = Supervisor("svc", intensity=5, children=[Worker("s", Streamer)])
        async with otpmesh.start(tree) as app:
            port, receiver = otpmesh.Channel[int].open()
            with pytest.raises(otpmesh.ActorDiedError) as died:
                await otpmesh.retry(app.actor("svc/s").stream, 10, port, 3, str(tmp_path / "died"))
            notes = "\n".join(getattr(died.value, "__notes__", []))
            return notes, await _drain(receiver)

    notes, got = run_trio(body)
    assert got == [0, 1, 2]  # each item once
    assert "did not try again" in notes and "already streamed 3 values" in notes


@pytest.mark.timeout(60)
def test_a_stream_that_died_before_its_first_item_is_retried_whole(tmp_path: Path) -> None:
    async def body() -> tuple[int, list[int]]:
        tree = Supervisor("svc", intensity=5, children=[Worker("s", Streamer)])
        async with otpmesh.start(tree) as app:
            port, receiver = otpmesh.Channel[int].open()
            sent = await otpmesh.retry(
                app.actor("svc/s").stream, 5, port, 0, str(tmp_path / "died")
            )
            return sent, await _drain(receiver)

    sent, got = run_trio(body)
    assert sent == 5 and got == [0, 1, 2, 3, 4]
