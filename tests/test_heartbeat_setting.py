"""The heartbeat timeout is a setting of the app: ``otpmesh.start(tree, heartbeat_timeout=)``,
checked up front; ``OTPMESH_HEARTBEAT_TIMEOUT`` (else 2 s) stays the default."""

from __future__ import annotations

import math
import os

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Supervisor, Worker, chaos
from otpmesh._runtime._proc import HEARTBEAT_TIMEOUT
from tests.actors import Member
from tests.conftest import run_trio

TREE = Supervisor("s", intensity=3, children=[Worker("w", Member)])


@pytest.mark.parametrize("bad", [0, -1.0, 0.1, math.inf, math.nan, "5", True])
def test_a_heartbeat_timeout_that_is_not_a_usable_number_of_seconds_is_refused(
    bad: object,
) -> None:
    async def body() -> None:
        with pytest.raises(ValueError, match=r"heartbeat_timeout must be a number of seconds"):
            async with otpmesh.start(TREE, heartbeat_timeout=bad):  # type: ignore[arg-type]
                pass

    trio.run(body)


def test_the_default_is_the_environments_or_two_seconds() -> None:
    assert HEARTBEAT_TIMEOUT == float(os.environ.get("OTPMESH_HEARTBEAT_TIMEOUT", "2.0"))


def test_a_stopped_worker_is_hung_after_the_apps_own_heartbeat_timeout() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE, heartbeat_timeout=0.7) as app:
            pid = await app.actor("s/w").pid()
            await chaos.hang(app, "s/w")
            with trio.fail_after(30):
                while not app.events.of_kind(LogKind.CHILD_EXITED):
                    await trio.sleep(0.02)
            (exited,) = app.events.of_kind(LogKind.CHILD_EXITED)
            assert "hung (stopped: no heartbeat for 0.7 s)" in otpmesh.describe(exited.reason)
            assert await app.actor("s/w").pid() != pid

    run_trio(body)
