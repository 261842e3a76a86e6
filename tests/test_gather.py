"""otpmesh.gather: many Futures as one, every call sent at once and waited for in one task.

Real worker processes throughout; the SIGKILL case is in test_pipelining.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import Supervisor, Worker
from tests.actors import Echo
from tests.aio_actors import Rollout
from tests.conftest import run_program, run_trio
from tests.pipelined_actors import Ledger

N = 10_000


@pytest.mark.timeout(120)
def test_ten_thousand_calls_to_one_actor_come_back_once_each_in_argument_order() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            ref = (await procs.spawn("w", Echo))[0]
            futures = [ref.echo(i) for i in range(N)]
            assert await otpmesh.gather(*futures) == list(range(N))
            # Each Future ended with its own reply: awaiting it again sends nothing.
            assert all(f.done() for f in futures)
            assert [await f for f in futures[:5]] == [0, 1, 2, 3, 4]
            records = [ref.record(i) for i in range(N)]
            assert await otpmesh.gather(*records) == [None] * N
            assert await ref.history() == list(range(N))  # each call ran once, in order

    run_trio(body, timeout=100)


@pytest.mark.timeout(60)
def test_a_failure_is_raised_after_every_call_ended_or_returned_in_place() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            ref = mesh[0]
            calls = [ref.record(1), ref.fail_softly("first"), ref.fail_softly("second")]
            with pytest.raises(otpmesh.ActorError, match="first"):
                await otpmesh.gather(*calls, ref.record(2), mesh[1].echo(3))
            # It waited for them all: the call after the failures ran before it raised.
            assert await ref.history() == [1, 2]
            got = await otpmesh.gather(
                ref.echo(0), ref.fail_softly("here"), mesh.echo(2), return_exceptions=True
            )
            assert got[0] == 0 and list(got[2]) == [2, 2]  # a broadcast: the general way
            assert isinstance(got[1], otpmesh.ActorError) and "here" in str(got[1])
            assert await otpmesh.gather() == []

    run_trio(body)


@pytest.mark.timeout(60)
def test_arguments_must_be_futures_and_an_ended_future_gives_its_result_again() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            ref = (await procs.spawn("w", Echo))[0]
            with pytest.raises(TypeError, match="argument 1 is 5: pass the endpoint's call"):
                otpmesh.gather(ref.echo(1), 5)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="return_exceptions must be True or False"):
                otpmesh.gather(ref.echo(1), return_exceptions=None)  # type: ignore[arg-type]
            done = ref.record("once")
            await done
            again = ref.record("twice")
            assert await otpmesh.gather(done, again, again) == [None, None, None]
            assert await ref.history() == ["once", "twice"]  # neither sent again
            slow = ref.sleep(30)

            async def elsewhere() -> None:
                await slow

            async with trio.open_nursery() as nursery:
                nursery.start_soon(elsewhere)  # in flight there: gather says so
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(otpmesh.MeshError, match="being awaited already"):
                    await otpmesh.gather(slow)
                nursery.cancel_scope.cancel()

    run_trio(body)


@pytest.mark.timeout(60)
def test_cancelling_a_gather_cancels_its_calls_and_ignores_late_replies(tmp_path: Path) -> None:
    gate = str(tmp_path / "gate")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            ref = (await procs.spawn("w", Echo))[0]
            calls = [ref.hold(gate), *(ref.record(i) for i in range(100))]
            with trio.CancelScope() as scope:

                async def cancel_once_held() -> None:
                    while not os.path.exists(f"{gate}.held"):
                        await trio.sleep(0.01)
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_once_held)
                    await otpmesh.gather(*calls)
            assert scope.cancelled_caught
            # The actor was told: the held call ended (it never would on its own: an answer
            # to the call queued behind it says so), the queued calls never ran.
            assert await ref.echo("alive") == "alive"
            assert await ref.history() == []
            # A cancelled Future may be awaited again: it is sent again.
            assert not calls[1].done()
            assert await otpmesh.gather(*calls[1:4]) == [None] * 3
            assert await ref.history() == [0, 1, 2]
            # A timeout from .get() in a thread of the run: CallTimeoutError naming the late.
            late = otpmesh.gather(ref.hold(gate), ref.echo(1))
            with pytest.raises(
                otpmesh.CallTimeoutError, match=r"'gather' on w/0, w/0 timed out"
            ) as err:
                await trio.to_thread.run_sync(lambda: late.get(timeout=0.2))
            assert err.value.actors == ["w/0", "w/0"]
            open(gate, "w").close()

    run_trio(body)


@pytest.mark.timeout(120)
def test_calls_the_actor_never_got_before_it_crashed_are_sent_to_its_next_incarnation(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    crash_at = 300

    async def main() -> list[object]:
        tree = Supervisor("p", children=[Worker("w", Ledger, args=(str(journal),))])
        async with otpmesh.start(tree) as app:
            ref = app.actor("p/w")
            calls = (ref.note_or_crash(seq, crash_at) for seq in range(2_000))
            return await otpmesh.gather(*calls, return_exceptions=True)

    results = run_trio(main, timeout=100)
    error = results[crash_at]
    assert isinstance(error, otpmesh.ActorError) and f"crash at call {crash_at}" in str(error)
    others = [r for i, r in enumerate(results) if i != crash_at]
    assert not [r for r in others if isinstance(r, BaseException)], "a call was not re-sent"
    first, second = {r[0] for r in others[:crash_at]}, {r[0] for r in others[crash_at:]}  # type: ignore[index]
    assert len(first) == 1 and len(second) == 1 and first != second
    ran = [int(line.split()[1]) for line in journal.read_text().splitlines()]
    assert sorted(ran) == [seq for seq in range(2_000) if seq != crash_at]  # each once


@pytest.mark.timeout(60)
def test_an_asyncio_actor_gathers_calls_to_another_actor() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            rollouts = await procs.spawn("r", Rollout)
            prompts = [f"p{i}" for i in range(50)]
            expected = [await rollouts[1].generate(p) for p in prompts]
            assert await rollouts[0].ask_all(rollouts[1], prompts) == expected

    run_trio(body)


@pytest.mark.timeout(120)
def test_get_from_a_plain_thread_gathers_through_the_background_run(tmp_path: Path) -> None:
    done = run_program(
        tmp_path / "gathers.py",
        "import otpmesh\n"
        "class Echo(otpmesh.Actor):\n"
        "    @otpmesh.endpoint\n"
        "    async def echo(self, x):\n"
        "        return x\n"
        "    @otpmesh.endpoint(let_it_crash=False)\n"
        "    def fail_softly(self, message):\n"
        "        raise KeyError(message)\n"
        "if __name__ == '__main__':\n"
        "  procs = otpmesh.proc_mesh(procs=1).get()\n"
        "  ref = procs.spawn('w', Echo).get()[0]\n"
        "  values = otpmesh.gather(*(ref.echo(i) for i in range(1000))).get()\n"
        "  print('in order:', values == list(range(1000)))\n"
        "  print('mixed:', otpmesh.gather(ref.echo('a'), ref.fail_softly('b'),"
        " return_exceptions=True).get())\n"
        "  procs.stop().get()\n",
    )
    assert done.returncode == 0, done.stderr
    assert "in order: True" in done.stdout
    assert "mixed: ['a', ActorError(" in done.stdout


@pytest.mark.timeout(60)
def test_calls_sent_together_run_in_the_order_they_were_sent() -> None:
    """A call to an endpoint that suspends, then calls to a plain-def one, arriving in one
    read while the actor is idle: the first is handed to the actor's task, and the others
    must queue behind it, not run at once in the reader ahead of it."""

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            ref = (await procs.spawn("w", Echo))[0]
            for round in range(3):
                calls = [ref.record_later((round, "first")), *(ref.record(i) for i in range(5))]
                await otpmesh.gather(*calls)
            expected = [x for r in range(3) for x in [(r, "first"), *range(5)]]
            assert await ref.history() == expected

    run_trio(body)
