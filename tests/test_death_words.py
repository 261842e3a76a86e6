"""How a process died reads the same wherever it is known: an actor whose call into a process
that died fails hears what the controller hears, and no error names an internal socket address.

Real processes, real SIGKILL."""

from __future__ import annotations

import os
import signal

import pytest
import trio

import otpmesh
from tests.conftest import run_trio


class Napper(otpmesh.Actor):
    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    async def nap(self) -> None:
        await trio.sleep(600)


class Caller(otpmesh.Actor):
    @otpmesh.endpoint
    async def call(self, ref: otpmesh.ActorRef, method: str) -> str:
        """What this actor's call of `method` on `ref` ends with, in words."""
        try:
            await ref.endpoint(method)()
        except otpmesh.ActorDiedError as exc:
            return str(exc)
        return "answered"


def _internal_name_in(text: str) -> bool:
    return "\x00" in text or "otpmesh/" in text


@pytest.mark.timeout(60)
def test_an_actor_whose_callee_is_sigkilled_mid_call_hears_how_it_died() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            napper = (await procs.slice(procs=0).spawn("napper", Napper))[0]
            caller = (await procs.slice(procs=1).spawn("caller", Caller))[0]
            pid = await napper.pid()
            heard: list[str] = []
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    heard.append(await caller.call(napper, "nap"))

                nursery.start_soon(call)
                await trio.sleep(0.3)  # the call is in the napper's hands
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(otpmesh.ActorDiedError) as here:
                await napper.pid()
            said = f"napper/0 is dead: its process (pid {pid}) killed by signal 9 (SIGKILL)"
            assert str(here.value) == said  # the controller's words...
            assert heard == [said]  # ...are the calling actor's

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_call_into_a_dead_process_names_no_internal_address() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            napper = (await procs.slice(procs=0).spawn("napper", Napper))[0]
            caller = (await procs.slice(procs=1).spawn("caller", Caller))[0]
            pid = await napper.pid()
            assert await caller.call(napper, "pid") == "answered"  # connected to it
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(otpmesh.ActorDiedError, match="killed by signal 9"):
                await napper.pid()  # the controller has heard of the death
            for _ in range(3):  # told it is dying, or finding its socket gone: neither names it
                said = await caller.call(napper, "pid")
                assert said.startswith("napper/0 is dead: its process "), said
                assert not _internal_name_in(said), said

    run_trio(body)
