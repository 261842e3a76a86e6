"""The pool of warm snapshot files (``otpmesh/rdma/_pool.py``): a value sent every step is copied
into a file whose pages already exist, and never into one a reader may still map."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest
import torch
import trio
import trio.testing

import otpmesh
from otpmesh.rdma import RDMAError
from otpmesh.rdma._backend import Region
from otpmesh.rdma._channel import MAP_ABOVE, Channel
from otpmesh.rdma._handle import Handle
from otpmesh.rdma._pool import memory_limit, pool_limit
from otpmesh.rdma._registered import RegistryStatistics
from otpmesh.rdma._snapshot import Snapshot, end_when_freed, map_private
from tests.conftest import run_trio
from tests.rdma.channel_actors import Keeper, memfd_leftovers, serving_channel, settle_and_trim

NUMEL = MAP_ABOVE // 4  # float32: a value that travels as a snapshot file


@pytest.fixture(autouse=True)
def _workers_touch_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTPMESH_PRELOAD", raising=False)
    monkeypatch.delenv("OTPMESH_RDMA_BACKENDS", raising=False)
    monkeypatch.delenv("OTPMESH_CHANNEL_POOL", raising=False)


def test_values_sent_every_step_reuse_warm_files_and_kept_values_never_change() -> None:
    weights = torch.empty(NUMEL)

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            keeper = (await procs.spawn("k", Keeper))[0]
            # Kept: every file stays mapped, so each send needs a new one, and no later send
            # may be copied into an earlier one.
            for step in range(4):
                await keeper.keep(f"w{step}", weights.fill_(float(step)))
            stats = await _forgotten()
            assert (stats.reused, stats.mapped, stats.pooled) == (0, 4, 0), stats
            for step in range(4):  # these arguments are dropped: their files may be refilled
                assert await keeper.equals(f"w{step}", torch.full((NUMEL,), float(step)))
            # Dropped by the callee after each call: the files come back warm and are refilled.
            for step in range(10, 22):
                assert await keeper.holds(weights.fill_(float(step)), float(step)), step
            await keeper.forget()  # the kept ones go too
            here = await settle_and_trim()
            assert here["reused"] >= 4, here  # a few new files at first, then warm ones
            assert here["before"] == {"maps": 2 * here["pooled"], "fds": here["pooled"]}
            assert here["after"] == {"maps": 0, "fds": 0}

    run_trio(body, timeout=150)


async def _forgotten() -> RegistryStatistics:
    """This process's channel statistics once every value it sent is forgotten. A reader's
    unpin is a cast on its own connection to the owner, so it can arrive after the reply to
    the call that carried the value (on the call's connection): until it does, that value's
    buffer is still registered, not yet counted among the files readers map."""
    from otpmesh._node._node import current_node

    node = current_node()
    assert node is not None and isinstance(node.channel, Channel)
    registry = node.channel.registry
    with trio.fail_after(30):
        while (stats := registry.statistics()).buffers:
            await registry.wait_changed()
    return stats


class _Conn:
    """Stands in for a reader's connection: the registry knows connections only by identity."""


def test_leases_end_only_by_their_own_reader_and_a_lost_connection_orphans_the_file() -> None:
    """The owner's bookkeeping, request by request, as readers' connections would send them."""

    async def body() -> None:
        async with serving_channel("leases") as channel:
            reg = channel.registry
            a, b, c = _Conn(), _Conn(), _Conn()

            def offer() -> Handle:
                return Handle.from_wire(channel.offer(torch.ones(NUMEL), None))

            async def ask(conn: object, op: str, h: Handle, **more: object) -> object:
                request = {"op": op, "buffer": h.buffer, "token": h.token, **more}
                return await reg._serve(conn, request)  # type: ignore[arg-type]

            h = offer()
            await ask(a, "pin", h)
            await ask(a, "unpin", h, mapped=True)  # a maps it
            reg.drop(h.buffer)
            stats = reg.statistics()
            assert (stats.buffers, stats.mapped, stats.pooled) == (0, 1, 0)
            with pytest.raises(RDMAError, match="token its owner did not issue"):
                await ask(a, "unmapped", dataclasses.replace(h, token="0" * 32))
            await ask(b, "unmapped", h)  # b holds no lease of it: nothing ends
            await ask(a, "unpin", h, mapped=False)  # a's pin is long over: nothing ends
            assert (reg.statistics().mapped, reg.statistics().pooled) == (1, 0)
            await ask(a, "unmapped", h)
            assert (reg.statistics().mapped, reg.statistics().pooled) == (0, 1)

            h = offer()  # into the warm file
            assert reg.statistics().reused == 1
            await ask(c, "pin", h)
            await ask(c, "unpin", h, mapped=False)  # c copied: its lease ended with the pin
            await ask(a, "pin", h)  # a pins and may map, then its connection closes
            reg._release_pins(a)  # type: ignore[arg-type]
            reg.drop(h.buffer)
            stats = reg.statistics()
            assert (stats.buffers, stats.mapped, stats.pooled) == (0, 0, 0)  # closed, not pooled
            assert memfd_leftovers(os.getpid()) == {"maps": 0, "fds": 0}
            offer()
            assert reg.statistics().reused == 1  # a new file: the orphan was never refilled

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_containers_memory_limit_bounds_the_default(tmp_path: Path) -> None:
    machine = memory_limit(str(tmp_path / "none"))
    (tmp_path / "max").write_text("max\n")
    assert memory_limit(str(tmp_path / "max")) == machine  # no cgroup limit
    (tmp_path / "small").write_text(f"{machine // 8}\n")
    assert memory_limit(str(tmp_path / "small")) == machine // 8


def test_the_pool_limit_is_read_from_the_environment_and_zero_turns_reuse_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert pool_limit() == memory_limit() // 4 > 0  # a quarter of the memory it may use
    monkeypatch.setenv("OTPMESH_CHANNEL_POOL", "lots")
    with pytest.raises(RDMAError, match="OTPMESH_CHANNEL_POOL must be a number of bytes"):
        pool_limit()
    monkeypatch.setenv("OTPMESH_CHANNEL_POOL", "-1")
    with pytest.raises(RDMAError, match="not '-1'"):
        pool_limit()
    monkeypatch.setenv("OTPMESH_CHANNEL_POOL", "0")

    async def body() -> None:
        async with serving_channel("no-pool") as channel:
            for _ in range(2):
                h = Handle.from_wire(channel.offer(torch.ones(NUMEL), None))
                channel.registry.drop(h.buffer)
            stats = channel.registry.statistics()
            assert (stats.pooled, stats.reused) == (0, 0)
            assert memfd_leftovers(os.getpid()) == {"maps": 0, "fds": 0}

    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_forked_child_refills_with_copier_threads_of_its_own() -> None:
    """A refill copies in a thread per core; a process forked after its parent made them (a
    fork server started by a controller that already sent) must not wait on threads it lacks."""
    source = torch.ones(NUMEL)
    region = Region(source.data_ptr(), MAP_ABOVE)
    parent = Snapshot.of(region)
    parent.fill(region)  # the parent's copier threads exist now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's exit status is the assertion
        signal.alarm(20)  # a hung refill dies of SIGALRM
        child = Snapshot.of(region)
        child.fill(region)
        os._exit(0 if child.region.nbytes == MAP_ABOVE else 1)
    _, status = os.waitpid(pid, 0)
    parent.close()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_file_mapped_when_its_reader_forked_is_never_refilled() -> None:
    """A forked child inherits its parent's mapping and may keep it after the parent freed it:
    the parent's lease ends as ``forked``, and the owner closes the file rather than refill it."""

    async def body() -> None:
        async with serving_channel("forked") as channel:
            reg = channel.registry
            reader = _Conn()
            h = Handle.from_wire(channel.offer(torch.ones(NUMEL), None))
            await reg._serve(reader, {"op": "pin", "buffer": h.buffer, "token": h.token})  # type: ignore[arg-type]
            snap = reg.buffers[h.buffer].snapshot
            assert snap is not None
            memory = map_private(snap.fd, MAP_ABOVE)
            ends: list[bool] = []

            def end(forked: bool) -> None:
                ends.append(forked)
                reg.unmapped(id(reader), h.buffer, h.token, forked)

            end_when_freed(memory, end)
            await reg._serve(reader, {"op": "unpin", "buffer": h.buffer, "token": h.token})  # type: ignore[arg-type]
            sent = bytes(memory)  # the child compares bytes: torch may not work after a fork
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's exit status is the assertion
                try:
                    os.close(go_w)
                    os.read(go_r, 1)  # the parent freed its mapping and sent the next value
                    os._exit(0 if bytes(memory) == sent else 1)
                finally:
                    os._exit(2)
            os.close(go_r)
            try:
                reg.drop(h.buffer)
                del memory
                assert ends == [True]
                stats = reg.statistics()
                assert (stats.mapped, stats.pooled) == (0, 0)  # closed, not kept for a refill
                channel.offer(torch.full((NUMEL,), 2.0), None)
                assert reg.statistics().reused == 0
                os.write(go_w, b"x")
            finally:
                os.close(go_w)  # the child goes on (end of file) even if the parent failed
                status = await _reaped(pid)
            assert os.waitstatus_to_exitcode(status) == 0  # the child saw what was sent

    trio.run(body)


async def _reaped(pid: int, within: float = 30) -> int:
    """Child `pid`'s wait status; SIGKILLed (and reaped) if it has not exited `within` s."""
    with trio.move_on_after(within):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            await trio.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]
