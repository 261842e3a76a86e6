"""otpmesh.monarch keeps the rules Monarch's own tests pin (meta-pytorch/monarch,
python/tests/), each written here as a Monarch user meets it: sync actors that block on
``.get()`` next to their callees, meshes sent through ports, the runtime started by two
operations at once, and the all-sync-or-all-async rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from otpmesh import SpawnError, monarch
from otpmesh._runtime._controller_runtime import runtime
from otpmesh.monarch import (
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Extent,
    MeshFailure,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
)
from otpmesh.monarch.job import ProcessJob
from tests.conftest import run_trio
from tests.monarch_actors import (
    Aborter,
    Counter,
    Doomed,
    Finalizing,
    Hatchery,
    PortFailer,
    RaisingWatcher,
    Refuser,
    Relay,
    Watcher,
)


def test_a_blocking_get_in_a_plain_def_reaches_an_actor_of_its_own_process() -> None:
    async def body() -> None:
        procs = this_host().spawn_procs(per_host={"procs": 2})
        counters = procs.spawn("counters", Counter, 7)
        relays = procs.spawn("relays", Relay)  # each beside a counter, in one process
        # Each relay's .get() waits on both counters, its own process's among them.
        assert (await relays.ask.call(counters)).values() == [[7, 7], [7, 7]]

    run_trio(body, timeout=30)


def test_a_constructor_blocked_for_ever_leaves_its_process_serving_and_its_port_sends_a_mesh() -> (
    None
):
    async def body() -> None:
        procs = this_host().spawn_procs()
        await procs.initialized  # the node a channel opened in trio lives in
        port, receiver = Channel[ActorMesh[Counter]].open()
        procs.spawn("hatchery", Hatchery, procs, port)  # never finishes starting
        hatched = await receiver.recv()  # sent while it was still being spawned
        assert await hatched.get_value.call_one() == 42
        await procs.stop()

    run_trio(body, timeout=30)


def test_stopping_a_proc_mesh_while_an_actor_mesh_on_it_spawns_is_no_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[object] = []
    monkeypatch.setattr(monarch, "unhandled_fault_hook", faults.append)

    async def body() -> None:
        procs = this_host().spawn_procs()
        await procs.initialized
        port, receiver = Channel[ActorMesh[Counter]].open()
        hatchery = procs.spawn("hatchery", Hatchery, procs, port)
        await receiver.recv()  # its constructor runs: the spawn is under way
        await procs.stop()
        with pytest.raises(SpawnError, match="spawning 'hatchery' failed"):
            await hatchery.initialized

    run_trio(body, timeout=30)
    assert faults == []


def test_operations_racing_to_start_the_runtime_all_get_the_one_runtime() -> None:
    # trio wakes the waiters of one event in a shuffled order: 20 runs try both orders.
    async def race() -> None:
        got = []

        async def first_use() -> None:
            got.append(await runtime())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_use)
            nursery.start_soon(first_use)
        assert got[0] is got[1]

    for _ in range(20):
        trio.run(race)


def test_a_base_exception_in_an_endpoint_kills_the_actor_with_a_supervision_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda failure: None)

    async def body() -> None:
        doomed = this_host().spawn_procs().spawn("doomed", Doomed)
        died = "The actor doomed/0 and all its descendants have failed: "
        # Monarch's words, as its users match them, then otpmesh's detail.
        fell = r"^Endpoint call doomed\.fall\(\) failed, " + died + "it raised Doom: the floor"
        with pytest.raises(SupervisionError, match=fell):
            await doomed.fall.call_one()
        # Monarch's SupervisionError is a RuntimeError; later calls hear the actor is dead.
        with pytest.raises(RuntimeError, match=died + "doomed/0 is dead: .*Doom"):
            await doomed.ping.call_one()
        # An Exception still goes back to the caller, and the actor lives (Counter.fail).
        counter = this_host().spawn_procs().spawn("counter", Counter, 1)
        with pytest.raises(ActorError, match="ValueError"):
            await counter.fail.call_one("no")
        assert await counter.get_value.call_one() == 1

    run_trio(body, timeout=30)


def test_a_failed_spawn_gives_the_fault_hook_one_failure_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch, "unhandled_fault_hook", faults.append)

    async def body() -> None:
        refusers = this_host().spawn_procs(per_host={"gpus": 2}).spawn("refusers", Refuser)
        with pytest.raises(SpawnError, match="spawning 'refusers' failed on 2 of 2"):
            await refusers.initialized

    run_trio(body, timeout=30)
    assert [(f.mesh, f.path, f.rank) for f in faults] == [
        ("refusers", "refusers/0", 0),
        ("refusers", "refusers/1", 1),
    ]
    for rank, fault in enumerate(faults):
        assert f"ValueError: rank {rank} will not start" in str(fault)


@pytest.mark.parametrize("method", ["fail", "fail_concurrently"])
def test_an_explicit_port_endpoint_that_raises_kills_its_actor(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda failure: None)

    async def body() -> None:
        failer = this_host().spawn_procs().spawn("failer", PortFailer)
        assert await failer.ping.call_one() == "pong"
        with pytest.raises(SupervisionError, match=f"ValueError: no answer from {method}"):
            await getattr(failer, method).call_one()
        with pytest.raises(SupervisionError, match="failer/0 is dead"):
            await failer.ping.call_one()

    run_trio(body, timeout=30)


def test_concurrent_endpoint_wraps_async_defs_only_and_never_an_endpoint() -> None:
    with pytest.raises(ValueError, match=r"can only wrap async endpoints: .*ping is a plain def"):

        class Plain(Actor):
            @concurrent_endpoint
            def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self) -> str:
                return "pong"


class Mixed(Actor):
    @endpoint
    def plain(self) -> None:
        pass

    @endpoint
    async def awaiting(self) -> None:
        pass


def test_an_actor_mixing_plain_and_async_endpoints_is_refused_at_spawn() -> None:
    async def body() -> None:
        procs = this_host().spawn_procs()
        with pytest.raises(
            ValueError,
            match=r"Mixed mixes both async and sync endpoints.*"
            r"sync: \['plain'\] async: \['awaiting'\]",
        ):
            procs.spawn("mixed", Mixed)
        await procs.stop()

    run_trio(body, timeout=30)


def test_extents_are_dicts_with_monarchs_labels_and_sizes() -> None:
    extent = Extent(["hosts", "gpus"], [2, 4])
    assert extent == {"hosts": 2, "gpus": 4}
    assert (extent.labels, extent.sizes, extent.nelements) == (["hosts", "gpus"], [2, 4], 8)
    hosts = ProcessJob({"hosts": 2}).state(cached_path=None).hosts  # no process yet
    assert isinstance(hosts.extent, Extent) and hosts.extent.labels == ["hosts"]
    with pytest.raises(ValueError, match="2 labels for 1 sizes"):
        Extent(["hosts", "gpus"], [2])


@pytest.mark.parametrize("reason", [None, "out of patience"])
def test_abort_ends_the_actor_and_its_fault_gives_the_reason(
    reason: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults: list[MeshFailure] = []

    async def body() -> None:
        reported = trio.Event()

        def hook(failure: MeshFailure) -> None:  # called in this run, when the exit is heard
            faults.append(failure)
            reported.set()

        monkeypatch.setattr(monarch, "unhandled_fault_hook", hook)
        aborter = this_host().spawn_procs().spawn("aborter", Aborter)
        with pytest.raises(SupervisionError, match="aborted: "):
            await aborter.abort.call_one(reason)
        await reported.wait()

    run_trio(body, timeout=30)
    [fault] = faults
    # Monarch's report names the actor, its class and the reason.
    why = reason or "no reason provided"
    assert f"actor <tests.monarch_actors.Aborter aborter/0> aborted: {why}" in fault.report()
    with pytest.raises(RuntimeError, match="abort\\(\\) ends the running actor"):
        monarch.context().actor_instance.abort("from the client")


def test_a_stopped_proc_mesh_refuses_spawns_at_once() -> None:
    async def body() -> None:
        procs = this_host().spawn_procs()
        await procs.initialized
        await procs.stop()
        with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
            procs.spawn("late", Counter, 0)

    run_trio(body, timeout=30)


def test_a_graceful_stop_finalizes_what_the_workers_own_modules_hold(tmp_path: Path) -> None:
    # A module global's __del__ runs when its process ends in order, as at a Python exit.
    marker = tmp_path / "marker"
    marker.write_text("not finalized")

    async def body() -> None:
        procs = this_host().spawn_procs()
        finalizing = procs.spawn("finalizing", Finalizing, str(marker))
        await finalizing.pid.call_one()
        await procs.stop()  # returns once the process has ended

    run_trio(body, timeout=30)
    assert marker.read_text() == "finalized"


def test_supervise_runs_while_an_endpoint_of_its_actor_awaits_what_it_sets() -> None:
    # Monarch's owners wait in an endpoint for their __supervise__ to hear of a failure.
    async def body() -> None:
        procs = this_host().spawn_procs()
        children = this_host().spawn_procs()  # the child's processes are not the owner's
        watcher = procs.spawn("watcher", Watcher, children)
        heard = await watcher.fail_child_and_wait.call_one()
        # Printed as Monarch prints it; otpmesh's words are its event.
        assert heard.startswith("MeshFailure(mesh_name=doomed, crashed_ranks=[0], event=doomed/0")
        assert "Doom: the floor gave way" in heard

    run_trio(body, timeout=30)


def test_a_supervise_that_raises_fails_its_actor_and_the_callers_hear_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monarch, "unhandled_fault_hook", lambda failure: None)

    async def body() -> None:
        procs, children = this_host().spawn_procs(), this_host().spawn_procs()
        watcher = procs.spawn("watcher", RaisingWatcher, children)
        # The call in flight when the hook raised hears the hook's error and the child's.
        with pytest.raises(SupervisionError, match=r"(?s)doomed/0.*boom from __supervise__"):
            await watcher.fail_child_and_wait.call_one()

    run_trio(body, timeout=30)
