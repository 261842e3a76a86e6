"""otpmesh.monarch: Monarch programs, changed only in their imports, run here with Monarch's
semantics (from Monarch's public docs: docs/source/actors.md), on real worker processes.

Most tests drive the API from trio (the test's own run hosts the runtime, so nothing outlives
it); the sync-script and asyncio-program tests run real programs in a fresh interpreter, as a
user would, because their client runtime lives as long as the process."""

from __future__ import annotations

import operator
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import monarch
from otpmesh.monarch import Accumulator, ActorError, ValueMesh, this_host, this_proc
from tests.conftest import run_program, run_trio
from tests.monarch_actors import (
    AsyncCaller,
    Builder,
    Caller,
    Cleaner,
    Counter,
    Echo,
    Gate,
    Manager,
    Mortal,
    Ported,
    Spawner,
    ThreadLocal,
)

ROOT = Path(__file__).resolve().parent.parent


def _program(path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` as a user's program, in a fresh interpreter that finds tests.monarch_actors."""
    head = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
    return run_program(path, head + textwrap.dedent(body))


def test_a_sync_script_spawns_broadcasts_calls_and_stops(tmp_path: Path) -> None:
    # Monarch's own first example: no event loop anywhere, .get() on every result.
    result = _program(
        tmp_path / "counter.py",
        """
            from otpmesh.monarch import get_or_spawn_controller, this_host
            from tests.monarch_actors import Counter

            procs = this_host().spawn_procs(per_host={"gpus": 4})
            counters = procs.spawn("counters", Counter, 0)
            counters.incr.broadcast()
            print(counters.get_value.call().get().values())
            print(counters.slice(gpus=2).where.call_one().get()["rank"])
            procs.stop().get()
            print("stopped")
            # The app's one controller actor, from a script that started nothing else yet.
            c = get_or_spawn_controller("c", Counter, 1).get()
            c.incr.call_one().get()
            print(get_or_spawn_controller("c", Counter, 5).get().get_value.call_one().get())
            left = this_host().spawn_procs(per_host={"procs": 2}).spawn("left", Counter, 0)
            print(*left.pid.call().get().values())  # left running: the exit stops them
        """,
    )
    assert result.returncode == 0, result.stderr
    *lines, pids = result.stdout.splitlines()
    assert lines == ["[1, 1, 1, 1]", "2", "stopped", "2"]
    for pid in map(int, pids.split()):
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"worker {pid} outlived the script"


def test_an_asyncio_program_awaits_the_same_futures(tmp_path: Path) -> None:
    result = _program(
        tmp_path / "aio.py",
        """
            import asyncio
            from otpmesh.monarch import this_host
            from tests.monarch_actors import Counter

            async def main():
                counters = this_host().spawn_procs(per_host={"procs": 2}).spawn(
                    "c", Counter, 5)
                values = await counters.get_value.call()
                print(sorted(values.values()))
                print(await counters.slice(procs=1).get_value.call_one())

            asyncio.run(main())
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[5, 5]", "5"]


def test_an_endpoints_exception_goes_to_its_caller_and_the_actor_keeps_its_state() -> None:
    async def body() -> None:
        counters = this_host().spawn_procs(per_host={"procs": 2}).spawn("c", Counter, 0)
        one = counters.slice(procs=0)
        await one.incr.call_one()
        with pytest.raises(ActorError, match="ValueError: no such thing"):
            await one.fail.call_one("no such thing")
        with pytest.raises(ActorError, match="no such thing"):
            await counters.fail.call("no such thing")
        assert await one.get_value.call_one() == 1  # the same instance: its state kept

    run_trio(body)


def test_calls_sent_without_awaiting_arrive_in_order() -> None:
    async def body() -> None:
        counter = this_host().spawn_procs().spawn("c", Counter, 0)
        futures = [counter.record.call_one(i) for i in range(50)]  # sent at once, in order
        for i in range(50, 60):
            counter.record.broadcast(i)
        assert await counter.recorded.call_one() == list(range(60))
        assert [await f for f in futures] == [None] * 50

    run_trio(body)


def test_plain_and_async_endpoints_call_other_actors_and_pass_meshes() -> None:
    async def body() -> None:
        procs = this_host().spawn_procs(per_host={"procs": 2})
        counters = procs.spawn("counters", Counter, 3)
        caller = this_proc().spawn("caller", Caller)
        # The mesh travels as an argument and is used there with Monarch's adverbs.
        assert await caller.total_of.call_one(counters) == 6  # .get() in a plain def
        awaiting = this_proc().spawn("awaiting", AsyncCaller)
        assert await awaiting.total_awaited.call_one(counters) == 6
        await caller.bump_all.call_one(counters)
        # The actor's broadcast and our next call come from two senders: no order between
        # them (only each sender's own messages are in order), so wait for it to land.
        while (await counters.get_value.call()).values() != [4, 4]:
            await trio.sleep(0.01)

    run_trio(body)


def test_a_call_cycle_through_blocking_gets_is_refused_not_hung() -> None:
    async def body() -> None:
        caller = this_host().spawn_procs().spawn("caller", Caller)
        echo = this_proc().spawn("echo", Echo, caller)
        with pytest.raises(ActorError, match="DeadlockError"):
            await caller.call_back.call_one(echo)
        assert await caller.ping.call_one() == "pong"  # it lives on

    run_trio(body)


def test_ranks_sizes_and_context_inside_actors() -> None:
    async def body() -> None:
        mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}).spawn("m", Counter, 0)
        where = await mesh.where.call()
        assert len(where) == 4
        for point, seen in where:
            assert seen["rank"] == point.rank
            assert seen["coords"] == dict(point)
            assert seen["size"] == {"hosts": 2, "gpus": 2}
            assert seen["id"].startswith("m")

    run_trio(body)


def test_value_mesh_items_slice_flatten_from_indexed_and_bad_points() -> None:
    vm = ValueMesh({"hosts": 2, "gpus": 2}, [10, 11, 12, 13])
    assert vm.item(hosts=1, gpus=0) == 12
    assert [(dict(p), v) for p, v in vm][1] == ({"hosts": 0, "gpus": 1}, 11)
    assert vm.slice(hosts=1).values() == [12, 13]
    assert vm.flatten("ranks").extent == {"ranks": 4}
    assert ValueMesh.from_indexed({"gpus": 2}, {1: "b", 0: "a"}).values() == ["a", "b"]
    with pytest.raises(ValueError, match="not a point"):
        vm.item(hosts=5, gpus=0)
    with pytest.raises(ValueError, match="no value for rank 1"):
        ValueMesh.from_indexed({"gpus": 2}, {0: "a"})


def test_accumulator_and_stream_over_a_mesh() -> None:
    async def body() -> None:
        counters = this_host().spawn_procs(per_host={"procs": 3}).spawn("c", Counter, 2)
        total = Accumulator(counters.get_value, 0, operator.add)
        assert await total.accumulate() == 6
        ranks = sorted([(await f)["rank"] for f in counters.where.stream()])
        assert ranks == [0, 1, 2]

    run_trio(body)


def test_a_stream_from_a_script_is_sound_however_its_threads_are_scheduled(
    tmp_path: Path,
) -> None:
    # The stream's driver runs on the background run's thread and may settle the first reply
    # before the script's thread has made the futures; the script's thread is held up here
    # (in making the stream's first future), which made the driver find no future to settle.
    result = _program(
        tmp_path / "stream.py",
        """
            import operator, threading, time
            from otpmesh.monarch import Accumulator, this_host, _meshes
            from tests.monarch_actors import Counter

            class Slow(_meshes.Future):
                def __init__(self, owner):
                    if threading.current_thread() is threading.main_thread():
                        time.sleep(0.5)
                    super().__init__(owner)

            procs = this_host().spawn_procs(per_host={"gpus": 3})
            counters = procs.spawn("counters", Counter, 2)
            counters.get_value.call().get()
            _meshes.Future = Slow
            print(Accumulator(counters.get_value, 0, operator.add).accumulate().get())
            print(sorted(f.get()["rank"] for f in counters.where.stream()))
            procs.stop().get()
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["6", "[0, 1, 2]"]
    assert "Exception ignored" not in result.stderr, result.stderr


def test_stopped_meshes_refuse_calls_and_a_second_stop(tmp_path: Path) -> None:
    log = tmp_path / "cleanup.log"

    async def body() -> None:
        procs = this_host().spawn_procs(per_host={"procs": 2})
        mesh = procs.spawn("cleaners", Cleaner, str(log))
        assert (await mesh.ping.call()).values() == ["pong", "pong"]
        await mesh.stop()
        assert log.read_text().splitlines() == ["cleanup True", "cleanup True"]
        with pytest.raises(otpmesh.OtpmeshError):
            await mesh.ping.call()
        with pytest.raises(otpmesh.OtpmeshError, match="stop"):
            await mesh.stop()
        await procs.stop()
        with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
            procs.spawn("late", Counter, 0)  # refused at once, as Monarch does
        with pytest.raises(otpmesh.MeshError, match="already stopped"):
            await procs.stop()

    run_trio(body)


def test_get_or_spawn_controller_gives_every_caller_the_same_actor() -> None:
    async def body() -> None:
        async with otpmesh.start(otpmesh.Supervisor("app", children=[])):
            first = await monarch.get_or_spawn_controller("counter", Counter, 7)
            await first.incr.call_one()
            again = await monarch.get_or_spawn_controller("counter", Counter, 0)
            assert await again.get_value.call_one() == 8

    run_trio(body)


def test_future_get_refuses_to_block_the_trio_thread_and_times_out_elsewhere() -> None:
    async def body() -> None:
        counter = this_host().spawn_procs().spawn("c", Counter, 1)
        future = counter.get_value.call_one()
        with pytest.raises(RuntimeError, match="use 'await fut'"):
            future.get()
        assert await future == 1
        assert future.get() == 1  # kept: read again at once
        assert await trio.to_thread.run_sync(counter.get_value.call_one().get) == 1

    run_trio(body)


def test_monarch_actors_in_a_declared_tree_restart_after_sigkill() -> None:
    counters_spec = otpmesh.Mesh("counters", Counter, shape={"procs": 2}, args=(0,))
    tree = otpmesh.Supervisor("rl", children=[counters_spec])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            counters = monarch.ActorMesh.from_otpmesh(app.mesh("rl/counters"))
            await counters.incr.call()
            assert (await counters.get_value.call()).values() == [1, 1]
            await otpmesh.chaos.kill(app, "rl/counters/1")
            await app.settled()
            assert (await counters.get_value.call()).values() == [1, 0]  # a new incarnation

    run_trio(body)


def test_what_cannot_carry_over_says_what_to_do_instead() -> None:
    with pytest.raises(NotImplementedError, match="never pickles"):
        this_host().spawn_procs(bootstrap=lambda: None)
    with pytest.raises(NotImplementedError, match="tensor engine"):
        monarch.endpoint(propagate=lambda x: x)
    with pytest.raises(TypeError, match=r"use \.call"):
        monarch.ActorMesh(None, None, {}).ping()  # type: ignore[arg-type]


def test_constructor_and_endpoints_share_one_thread_and_sync_ones_see_no_loop() -> None:
    async def body() -> None:
        actor = this_host().spawn_procs().spawn("tls", ThreadLocal)
        for _ in range(2):
            await actor.increment.call_one()
        assert await actor.value.call_one() == 2
        assert await actor.loop_visible.call_one() is False

    run_trio(body)


def test_a_constructor_spawns_and_blocks_on_get_and_ranks_print_as_in_monarch() -> None:
    async def body() -> None:
        procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2})
        assert (procs.size(), procs.size("gpus")) == (2, 2)
        spawners = procs.spawn("spawners", Spawner)
        assert (await spawners.first_total.call()).values() == [8, 8]
        texts = await spawners.rank_text.call()
        assert texts.flatten("r").slice(r=1).item() == "{'hosts': 0/1, 'gpus': 1/2}"

    run_trio(body)


@pytest.mark.parametrize("handle", [True, False])
def test_a_failure_in_an_owned_mesh_reaches_its_owners_supervise(
    handle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults: list[str] = []
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda f: faults.append(str(f)))

    async def body() -> None:
        manager = this_host().spawn_procs().spawn("manager", Manager, handle)
        await manager.break_one.call_one()
        if handle:  # handled: the owner lives and has seen it
            while not (seen := await manager.seen.call_one()):
                await trio.sleep(0.05)
            assert "workers/1" in seen[0] and "exited with code 3" in seen[0]
            assert faults == []
        else:  # not handled: the owner fails too; its callers and the program's hook hear of it
            with pytest.raises(monarch.SupervisionError):
                while True:
                    await manager.seen.call_one()
                    await trio.sleep(0.05)
            while not faults:
                await trio.sleep(0.05)
            assert "manager/0" in faults[0] and "not handled by its owner" in faults[0]

    run_trio(body)


def test_an_unowned_meshs_failure_reaches_the_programs_fault_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[str] = []
    monkeypatch.setattr(
        monarch, "unhandled_fault_hook", lambda failure: faults.append(str(failure))
    )

    async def body() -> None:
        procs = this_host().spawn_procs(per_host={"procs": 2})
        mortals = procs.spawn("mortals", Mortal)
        mortals.slice(procs=0).die.broadcast(5)
        while not faults:
            await trio.sleep(0.05)
        assert "mortals/0" in faults[0] and "exited with code 5" in faults[0]
        assert await mortals.slice(procs=1).ping.call_one() == "pong"  # the others live on
        # A constructor that fails is a fault too (Counter needs an argument).
        this_host().spawn_procs().spawn("broken", Counter)
        while len(faults) < 2:
            await trio.sleep(0.05)
        assert "broken" in faults[1] and "TypeError" in faults[1]

    run_trio(body)


def test_a_constructor_that_raises_ends_a_sync_program_with_status_1_and_one_line(
    tmp_path: Path,
) -> None:
    # Monarch's default hook exits 1: no interrupt's traceback, no 130, and `finally` still runs.
    result = run_program(
        tmp_path / "bad.py",
        textwrap.dedent(
            """
            from otpmesh.monarch import Actor, endpoint, this_host

            class Bad(Actor):
                def __init__(self):
                    raise ValueError("bad config")

                @endpoint
                def hello(self):
                    return "hi"

            if __name__ == "__main__":
                try:
                    bad = this_host().spawn_procs(per_host={"procs": 2}).spawn("bad", Bad)
                    print(bad.hello.call().get())
                finally:
                    print("finally")
            """
        ),
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == ["finally"]
    # The workers' own lines ("[bad/0] ...") show the constructor's traceback; the program's
    # are one line naming the rank.
    ours = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    assert ours == [
        "otpmesh.monarch: unhandled fault, the program ends: bad/0 (rank 0 of mesh bad) exited: "
        "spawning 'bad' failed: bad/0 raised ValueError: bad config"
    ], result.stderr
    assert "KeyboardInterrupt" not in result.stderr


def test_a_proc_mesh_travels_to_an_actor_that_spawns_on_it_and_finds_the_controller() -> None:
    async def body() -> None:
        async with otpmesh.start(otpmesh.Supervisor("app", children=[])):
            procs = this_host().spawn_procs(per_host={"procs": 3})
            builder = this_host().spawn_procs().spawn("builder", Builder)
            assert await builder.build_on.call_one(procs.slice(procs=slice(0, 2))) == 4
            assert await builder.controller_value.call_one() == 11
            shared = await monarch.get_or_spawn_controller("shared", Counter, 0)
            assert await shared.get_value.call_one() == 11

    run_trio(body)


def test_a_channels_port_travels_to_an_actor_which_streams_into_it(tmp_path: Path) -> None:
    # Monarch's sync form: Channel[int].open() and recv().get() from a plain script.
    result = _program(
        tmp_path / "channel.py",
        """
            from otpmesh.monarch import Channel, this_host
            from tests.monarch_actors import SendAlot

            procs = this_host().spawn_procs(per_host={"gpus": 1})
            sender = procs.spawn("send_alot", SendAlot)
            port, receiver = Channel[int].open()
            sender.send.broadcast(port, 100)
            print(all(receiver.recv().get() == i for i in range(100)))
            procs.stop().get()
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True"]


def test_explicit_response_ports_answer_now_later_or_crash_the_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[str] = []
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda f: faults.append(str(f)))

    async def body() -> None:
        ported = this_host().spawn_procs().spawn("ported", Ported)
        assert await ported.add.call_one(2) == 5
        later = ported.later.call_one()  # answered only when release() runs
        while not await ported.release.call_one(42):
            await trio.sleep(0.01)
        assert await later == 42
        # An exception escaping it: nobody else can answer, so the actor fails (Monarch).
        with pytest.raises(monarch.SupervisionError, match="never answered"):
            await ported.fail.call_one()
        while not faults:
            await trio.sleep(0.05)
        assert "ported/0" in faults[0]

    run_trio(body)


def test_a_broadcasts_exception_fails_the_actor_and_a_calls_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[str] = []
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda f: faults.append(str(f)))

    async def body() -> None:
        counters = this_host().spawn_procs(per_host={"procs": 2}).spawn("c", Counter, 0)
        with pytest.raises(ActorError, match="asked to"):
            await counters.fail.call("asked to")
        assert faults == []  # its callers heard of it: nothing failed
        counters.slice(procs=1).fail.broadcast("nobody asked")  # Monarch: the actor dies
        while not faults:
            await trio.sleep(0.05)
        assert "c/1" in faults[0] and "nobody asked" in faults[0]
        assert await counters.slice(procs=0).get_value.call_one() == 0
        with pytest.raises(monarch.SupervisionError):
            await counters.slice(procs=1).get_value.call_one()

    run_trio(body)


def test_concurrent_endpoints_wait_together_until_a_later_call_releases_them() -> None:
    async def body() -> None:
        gate = this_host().spawn_procs().spawn("gate", Gate)
        waiting = [gate.wait.call_one(i) for i in range(10)]  # all in flight at once
        while await gate.how_many.call_one() < 10:
            await trio.sleep(0.01)
        await gate.release.call_one()
        assert [await w for w in waiting] == list(range(10))
        with pytest.raises(ValueError, match="can only wrap async endpoints"):
            monarch.concurrent_endpoint(lambda self: None)

    run_trio(body)


def test_an_accumulator_folds_left_to_right_from_its_identity_over_any_stream() -> None:
    class Stream:  # a stand-in endpoint: one settled Future per value
        def __init__(self, values: list[int]) -> None:
            self.values, self.calls = values, []  # type: ignore[var-annotated]

        def stream(self, *args: object, **kwargs: object) -> object:
            self.calls.append((args, kwargs))
            return iter(monarch._future.settled(v) for v in self.values)

    async def body() -> None:
        folded = Accumulator(Stream([1, 2, 3]), [], lambda a, r: [*a, r])  # type: ignore[arg-type]
        assert await folded.accumulate() == [1, 2, 3]
        empty = Accumulator(Stream([]), 42, operator.add)  # type: ignore[arg-type]
        assert await empty.accumulate() == 42
        seen = Stream([1])
        await Accumulator(seen, 0, operator.add).accumulate("a", k=1)  # type: ignore[arg-type]
        assert seen.calls == [(("a",), {"k": 1})]
        with pytest.raises(TypeError, match="has no stream"):
            Accumulator(object(), 0, operator.add)  # type: ignore[arg-type]

    run_trio(body)


def test_this_proc_asked_from_many_threads_at_once_starts_one_process() -> None:
    async def body() -> None:
        n = 8
        barrier = threading.Barrier(n)

        def ask() -> object:
            barrier.wait()
            return this_proc()

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads switch often: the race, if any, shows

        got: list[object] = []

        async def one() -> None:
            got.append(await trio.to_thread.run_sync(ask))

        try:
            async with trio.open_nursery() as nursery:
                for _ in range(n):
                    nursery.start_soon(one)
        finally:
            sys.setswitchinterval(interval)
        assert len(got) == n and all(p is got[0] for p in got)
        await this_proc().stop()

    for _ in range(3):  # each a fresh run, so a fresh this_proc(): three chances for the race
        run_trio(body)
