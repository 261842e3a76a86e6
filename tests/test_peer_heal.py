"""Mesh(heal=...): a restarted member takes its state from a live peer before it serves
(docs/supervision.md, "Healing from a peer"). Real worker processes, real SIGKILLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import otpmesh
from otpmesh import ONE_FOR_ALL, Heal, LogKind, Mesh, SpecError, Supervisor, chaos
from otpmesh._controller._healpeers import PeerChoice
from otpmesh._controller._specwire import spec_from_wire, spec_to_wire
from tests.conftest import run_trio
from tests.heal_actors import BadLoad, NoLoad, NoState, Replica, SyncLoad

HUNDRED_MB = 25_000_000  # float32 parameters


async def _wait_restarted(app: otpmesh.App, path: str, incarnation: int = 2) -> None:
    await app.settled()
    started = [e for e in app.events.of_kind(LogKind.CHILD_STARTED) if e.child_path == path]
    assert started and started[-1].incarnation >= incarnation


@pytest.mark.timeout(180)
def test_a_sigkilled_replica_serves_its_peers_current_100mb_bit_exact_from_its_first_reply() -> (
    None
):
    tree = Supervisor(
        "root", children=[Mesh("m", Replica, shape={"procs": 4}, args=(HUNDRED_MB,), heal="peer")]
    )

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("root/m")
            assert (await mesh.train(1)).values() == [1, 1, 1, 1]
            assert (await mesh.train(2)).values() == [2, 2, 2, 2]
            await chaos.kill(app, "root/m/2")
            # The first call the new incarnation answers: it waits for the restart and the heal.
            healed = await mesh[2].snapshot()
            assert healed["restored_from"] == "peer"
            assert healed["served_when_loaded"] == 0  # loaded before it served anything
            assert healed["step"] == 2
            peer = await mesh[0].snapshot()
            assert torch.equal(healed["params"], peer["params"])
            assert bool(healed["params"].abs().sum() > 0)  # not the constructor's zeros
            del healed, peer
            # It goes on as a replica: the same update keeps it equal to its peers.
            assert (await mesh.train(3)).values() == [3, 3, 3, 3]
            digests = [r[0] for r in (await mesh.how()).values()]
            assert digests == ["constructor", "constructor", "peer", "constructor"]

    run_trio(body, timeout=170)


def _restoring(name: str, size: int, tmp_path: Path, params: torch.Tensor, **fields: Any) -> Mesh:
    """A ONE_FOR_ALL mesh of replicas whose fallback loads a checkpoint of `params` and step."""
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"params": params, "step": fields.pop("step")}, checkpoint)
    return Mesh(
        name,
        Replica,
        shape={"procs": size},
        args=(len(params), str(checkpoint)),
        strategy=ONE_FOR_ALL,
        intensity=3,
        heal=Heal(fallback="load_checkpoint"),
        **fields,
    )


@pytest.mark.timeout(60)
def test_every_member_restarted_together_runs_the_declared_fallback(tmp_path: Path) -> None:
    tree = _restoring("m", 3, tmp_path, torch.arange(8.0), step=7)

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("m")
            await mesh.train(1)
            await chaos.kill(app, "m/1")  # one-for-all: no member survives to heal from
            await _wait_restarted(app, "m/2")
            # Every member ran the fallback (none healed from a member restarted beside it).
            assert (await mesh.how()).values() == [("checkpoint", 7, 0)] * 3
            assert torch.equal((await mesh[2].snapshot())["params"], torch.arange(8.0))

    run_trio(body)


@pytest.mark.timeout(90)
def test_a_process_group_mesh_heals_its_new_epoch_from_the_fallback(tmp_path: Path) -> None:
    # No member of a broken epoch survives it (all are killed), so there is no peer to ask.
    tree = _restoring("dp", 2, tmp_path, torch.ones(4), step=3, process_group="gloo")

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("dp")
            await mesh.train(1)
            await chaos.kill(app, "dp/0")
            await _wait_restarted(app, "dp/1")
            assert (await mesh.how()).values() == [("checkpoint", 3, 0)] * 2

    run_trio(body, timeout=80)


@pytest.mark.timeout(120)
def test_a_process_group_heals_its_new_epoch_rank_by_rank_from_another_replica_group() -> None:
    def group(name: str, other: str) -> Mesh:
        return Mesh(
            name,
            Replica,
            shape={"procs": 2},
            args=(1 << 19,),  # 2 MB: over the tensor channel
            strategy=ONE_FOR_ALL,
            intensity=3,
            process_group="gloo",
            heal=Heal(from_=other),
        )

    tree = Supervisor("root", children=[group("a", "root/b"), group("b", "root/a")])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            a, b = app.mesh("root/a"), app.mesh("root/b")
            for rank in range(2):  # each rank its own shard: rank r must heal from rank r
                await a[rank].train(10 + rank)
                await b[rank].train(10 + rank)
            await chaos.kill(app, "root/a/0")  # the epoch breaks: both members of a are killed
            await _wait_restarted(app, "root/a/1")
            assert (await a.how()).values() == [("peer", 1, 0)] * 2
            for rank in range(2):
                healed, source = await a[rank].snapshot(), await b[rank].snapshot()
                assert torch.equal(healed["params"], source["params"])

    run_trio(body, timeout=110)


def test_heal_from_a_path_that_is_not_a_mesh_of_the_same_shape_is_refused_at_start() -> None:
    tree = Supervisor(
        "root",
        children=[
            Mesh("a", Replica, shape={"procs": 2}, args=(4,), heal=Heal(from_="root/b")),
            Mesh("b", Replica, shape={"procs": 3}, args=(4,)),
        ],
    )

    async def body() -> None:
        async with otpmesh.start(tree, placement="local"):
            pass

    with pytest.raises(SpecError, match=r"from_ names 'root/b'.*shape \{'procs': 3\}"):
        run_trio(body)
    with pytest.raises(SpecError, match=r"Heal: from_=\(\) is invalid"):
        Heal(from_=())
    assert Heal(from_=["peer", "rl/b"]).from_ == ("peer", "rl/b")


@pytest.mark.timeout(60)
def test_with_fallback_constructor_a_mesh_killed_whole_keeps_its_constructors_state() -> None:
    tree = Supervisor("root", intensity=3, children=[Mesh("m", Replica, args=(4,), heal="peer")])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("root/m")
            await mesh.train(5)
            await chaos.kill(app, "root/m")  # the whole mesh: its parent restarts it
            await _wait_restarted(app, "root/m/0")
            assert (await mesh.how()).values() == [("constructor", 0, None)]

    run_trio(body)


@pytest.mark.timeout(90)
def test_a_peer_that_dies_while_giving_its_state_is_skipped_for_the_next() -> None:
    tree = Mesh("m", Replica, shape={"procs": 3}, args=(1 << 19,), heal="peer", intensity=5)

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("m")
            await mesh.train(1)
            await mesh[0].fail_when_asked_for_state()
            await chaos.kill(app, "m/2")
            restored_from, step, served = await mesh[2].how()
            assert (restored_from, step, served) == ("peer", 1, 0)  # from m/1, after m/0 died
            await app.settled()
            exits = [e.child_path for e in app.events.of_kind(LogKind.CHILD_EXITED)]
            assert sorted(exits) == ["m/0", "m/2"]
            # m/0 came back too, and healed from a survivor.
            assert (await mesh[0].how())[:2] == ("peer", 1)

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_load_state_that_fails_is_a_start_failure_and_never_serves() -> None:
    tree = Mesh("m", BadLoad, shape={"procs": 2}, args=(4,), heal="peer", intensity=2)

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("m")
            await mesh.train(1)
            await chaos.kill(app, "m/1")
            await app.settled()
            failed = [e for e in app.events.of_kind(LogKind.START_FAILED)]
            assert failed and "load_state failed halfway" in str(failed[0].reason)

    with pytest.raises(otpmesh.SupervisorError, match="load_state failed halfway"):
        run_trio(body)


def test_heal_in_process_placement_heals_a_crashed_member_from_a_copy() -> None:
    tree = Mesh("m", Replica, shape={"procs": 2}, args=(4,), heal="peer", intensity=3)

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            mesh = app.mesh("m")
            await mesh.train(1)
            await chaos.crash(app, "m/0")
            assert (await mesh[0].how()) == ("peer", 1, 0)
            await mesh[0].train(2)  # a copy, not the peer's own tensor: only m/0 changes
            a, b = (await mesh.snapshot()).values()
            assert not torch.equal(a["params"], b["params"])

    run_trio(body)


# ---------------------------------------------------------------- the spec


def test_heal_peer_is_the_shorthand_for_heal_with_the_constructor_fallback() -> None:
    assert Mesh("m", Replica, heal="peer").heal == Heal()
    assert Heal().fallback == "constructor"
    assert Mesh("m", Replica).heal is None


def test_heal_on_a_class_without_a_state_endpoint_is_refused_naming_it() -> None:
    with pytest.raises(SpecError, match=r"Mesh 'm': heal='peer'.*NoState has no endpoint state"):
        Mesh("m", NoState, heal="peer")


def test_heal_on_a_class_without_an_async_load_state_is_refused() -> None:
    with pytest.raises(SpecError, match=r"NoLoad has no 'async def load_state\(self, state\)'"):
        Mesh("m", NoLoad, heal="peer")
    with pytest.raises(SpecError, match="SyncLoad has no 'async def load_state"):
        Mesh("m", SyncLoad, heal="peer")


def test_a_fallback_that_is_not_an_async_method_of_the_actor_is_refused() -> None:
    with pytest.raises(SpecError, match=r"Replica has no 'async def restore\(self\)'"):
        Mesh("m", Replica, heal=Heal(fallback="restore"))
    with pytest.raises(SpecError, match=r"Heal: fallback='a path/x.pt' is invalid"):
        Heal(fallback="a path/x.pt")


def test_bad_heal_values_are_refused_with_what_to_write() -> None:
    with pytest.raises(SpecError, match=r"heal='checkpoint' is invalid; allowed: None, 'peer'"):
        Mesh("m", Replica, heal="checkpoint")
    with pytest.raises(SpecError, match="Heal: timeout=0 is invalid"):
        Heal(timeout=0)
    with pytest.raises(SpecError, match=r"heal=.*'retries'.*is invalid"):
        Mesh("m", Replica, heal={"retries": 3})


def test_a_healing_mesh_travels_as_a_spec_and_is_checked_again() -> None:
    spec = Mesh("m", Replica, heal=Heal(fallback="load_checkpoint", timeout=5))
    arrived = spec_from_wire(spec_to_wire(spec))
    assert isinstance(arrived, Mesh) and arrived.heal == spec.heal
    with pytest.raises(SpecError, match="NoState has no endpoint state"):
        spec_from_wire(["Mesh", {"id": "m", "actor": NoState, "heal": {"timeout": 5}}])


def test_an_actor_named_by_import_path_is_checked_when_it_restarts() -> None:
    tree = Mesh("m", "tests.heal_actors:NoState", heal="peer")  # not imported here

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            await chaos.crash(app, "m/0")
            await app.settled()

    with pytest.raises(otpmesh.SupervisorError, match="m/0 cannot heal from a peer: NoState has"):
        run_trio(body)


# ---------------------------------------------------------------- which peer


def test_peers_are_the_survivors_of_the_last_exit_lowest_rank_first() -> None:
    choice = PeerChoice()
    for rank in "0123":
        choice.started(rank)
    choice.exited()  # one-for-one: 2 died
    assert choice.peers("2", ["0", "1", "3"]) == ["0", "1", "3"]
    choice.started("2")
    choice.exited()  # then 0 died: 2 survived this one
    assert choice.peers("0", ["3", "1", "2"]) == ["1", "2", "3"]


def test_members_restarted_after_the_exit_are_not_peers() -> None:
    choice = PeerChoice()
    for rank in "012":
        choice.started(rank)
    choice.exited()  # one-for-all: all are restarted in order
    assert choice.peers("0", []) == []
    choice.started("0")
    assert choice.peers("1", ["0"]) == []
    assert PeerChoice().peers("1", ["0"]) == []  # a new supervisor: nobody survived
