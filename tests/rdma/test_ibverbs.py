"""The ibverbs backend on its own, between two real processes, without the channel's core.

The owner is a forked process that registers buffers and answers ``serve`` requests over a pipe
(the out-of-band path the core provides in production); this process is the reader. The bytes
move by one-sided RDMA READ/WRITE on the device, checked exactly.

Needs an RDMA device: ``tests/rdma/run_softroce.sh`` runs this file in a QEMU guest with soft-RoCE
(rxe0). Everywhere else every test skips with the backend's reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
import trio

from otpmesh.rdma._backend import Caller, Peer, Region
from otpmesh.rdma._ibverbs import IbverbsBackend
from otpmesh.rdma._verbs import IbverbsPeerLost, IbverbsRemoteAccessError, IbverbsTimeout
from tests.conftest import SLOWDOWN

_WHY = IbverbsBackend().unavailable()  # opens and closes the device: nothing open across fork

pytestmark = [
    pytest.mark.ibverbs,
    pytest.mark.skipif(_WHY is not None, reason=f"ibverbs: {_WHY}"),
    # Soft-RoCE under QEMU moves tens of MiB/s; leave room beyond the 180 s default.
    pytest.mark.timeout(240),
]

SIZES = [1, 4096, 1 << 20, 16 << 20]


def _pattern(seed: int, nbytes: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def _owner_main(conn: Connection) -> None:
    """The owner process: registers buffers, serves connects, reports its buffers' contents."""
    backend = IbverbsBackend()
    buffers: dict[int, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            os._exit(0)
        seq, cmd, args = msg[0], msg[1], msg[2:]
        try:
            if cmd == "register":
                bid, nbytes, seed = args
                buf = (ctypes.c_char * nbytes).from_buffer_copy(_pattern(seed, nbytes))
                buffers[bid] = buf
                reply: Any = backend.register(
                    bid, Region(ctypes.addressof(buf), nbytes), writable=True
                )
            elif cmd == "register_torch":
                import torch

                bid, nbytes, seed = args
                tensor = torch.frombuffer(bytearray(_pattern(seed, nbytes)), dtype=torch.uint8)
                buffers[bid] = tensor
                region = Region(tensor.data_ptr(), tensor.numel() * tensor.element_size())
                reply = backend.register(bid, region, writable=True)
            elif cmd == "serve":
                op, payload = args
                # A connect does not look at who asks (a node's registry fills this in).
                caller = Caller(pid=None, region=Region(0, 0), writable=True, pinned=False)
                reply = trio.run(backend.serve, op, payload, caller)
            elif cmd == "unregister":
                backend.unregister(args[0])
                reply = None
            elif cmd == "digest":
                buf = buffers[args[0]]
                data = buf.numpy().tobytes() if hasattr(buf, "numpy") else bytes(buf)
                reply = hashlib.sha256(data).hexdigest()
            elif cmd == "connects":
                reply = backend.connects_served
            else:
                conn.send((seq, "ok", None))
                os._exit(0)
            conn.send((seq, "ok", reply))
        except Exception as exc:
            conn.send((seq, "err", repr(exc)))


class Owner:
    """The test's handle on an owner process: commands over a pipe, and a Peer for the reader."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_owner_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        assert self.proc.pid is not None
        self.pid = self.proc.pid
        self.seq = 0

    def _ask(self, msg: tuple[Any, ...]) -> Any:
        # Numbered, so a reply left over by an interrupted call is skipped, not taken for ours.
        self.seq += 1
        self.conn.send((self.seq, *msg))
        while True:
            seq, status, value = self.conn.recv()
            if seq == self.seq:
                break
        if status != "ok":
            raise RuntimeError(f"owner: {value}")
        return value

    def call(self, *msg: Any) -> Any:
        return self._ask(msg)

    async def request(self, backend: str, op: str, payload: Any) -> Any:
        assert backend == "ibverbs"
        # EOFError/BrokenPipeError here is how a dead owner shows on this out-of-band path.
        return await trio.to_thread.run_sync(self._ask, ("serve", op, payload))

    def peer(self) -> Peer:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        return Peer(self.pid, boot_id, os.readlink("/proc/self/ns/pid"), self.request)

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("exit")
            except (EOFError, OSError):
                pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture(scope="module")
def owner() -> Iterator[Owner]:
    owner = Owner()  # forked before this process opens any verbs object
    yield owner
    owner.stop()


@pytest.fixture(scope="module")
def reader() -> Iterator[IbverbsBackend]:
    backend = IbverbsBackend()
    yield backend
    backend.close()


_ids = iter(range(1, 1 << 30))


def _local(nbytes: int, fill: bytes | None = None) -> tuple[Any, Region]:
    buf = (ctypes.c_char * nbytes).from_buffer_copy(fill) if fill else (ctypes.c_char * nbytes)()
    return buf, Region(ctypes.addressof(buf), nbytes)


def _run(fn: Any, *args: Any, timeout: float = 200) -> Any:
    # Under the test's own timeout (240 s): trio's deadline ends the run cleanly, where
    # pytest-timeout's exception inside trio.run would leave the next test "inside a run".
    async def main() -> Any:
        with trio.fail_after(timeout * SLOWDOWN):
            return await fn(*args)

    return trio.run(main)


@pytest.mark.parametrize("nbytes", SIZES, ids=["1B", "4KiB", "1MiB", "16MiB"])
def test_read_and_write_exact_bytes(owner: Owner, reader: IbverbsBackend, nbytes: int) -> None:
    bid = next(_ids)
    entry = owner.call("register", bid, nbytes, bid)
    assert reader.reaches(entry, owner.peer())

    dst, dst_region = _local(nbytes)
    _run(reader.read, entry, owner.peer(), dst_region, 0)
    assert dst.raw == _pattern(bid, nbytes)

    new = _pattern(bid + 10_000, nbytes)
    _src, src_region = _local(nbytes, new)
    _run(reader.write, entry, owner.peer(), src_region, 0)
    assert owner.call("digest", bid) == hashlib.sha256(new).hexdigest()

    # A part, at an offset, both ways.
    if nbytes > 1:
        half = nbytes // 2
        part, part_region = _local(half)
        _run(reader.read, entry, owner.peer(), part_region, nbytes - half)
        assert part.raw == new[nbytes - half :]
        patch = bytes(reversed(part.raw))
        _patch, patch_region = _local(half, patch)
        _run(reader.write, entry, owner.peer(), patch_region, 1)
        expected = new[:1] + patch + new[1 + half :]
        assert owner.call("digest", bid) == hashlib.sha256(expected).hexdigest()
    owner.call("unregister", bid)


@pytest.mark.skipif(
    os.environ.get("OTPMESH_IBVERBS_TEST_TORCH") == "0",
    reason="OTPMESH_IBVERBS_TEST_TORCH=0 (run_softroce.sh: importing torch in the guest takes "
    "minutes; set it to 1 there to include this test)",
)
def test_torch_tensor_owner(owner: Owner, reader: IbverbsBackend) -> None:
    pytest.importorskip("torch")
    bid, nbytes = next(_ids), 1 << 20
    entry = owner.call("register_torch", bid, nbytes, bid)
    dst, dst_region = _local(nbytes)
    _run(reader.read, entry, owner.peer(), dst_region, 0)
    assert dst.raw == _pattern(bid, nbytes)
    owner.call("unregister", bid)


def test_queue_pair_created_once_per_owner(owner: Owner, reader: IbverbsBackend) -> None:
    before = owner.call("connects")
    bids = [next(_ids) for _ in range(3)]
    entries = [owner.call("register", bid, 8192, bid) for bid in bids]

    async def many_reads() -> None:
        # Concurrent transfers share the one cached queue pair.
        async def one(entry: dict[str, Any], bid: int) -> None:
            dst, region = _local(8192)
            await reader.read(entry, owner.peer(), region, 0)
            assert dst.raw == _pattern(bid, 8192)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                for entry, bid in zip(entries, bids, strict=True):
                    nursery.start_soon(one, entry, bid)

    _run(many_reads)
    _run(many_reads)
    assert owner.call("connects") - before <= 1  # 1 if no earlier test connected
    for bid in bids:
        owner.call("unregister", bid)


def test_out_of_bounds_is_refused_before_the_wire(owner: Owner, reader: IbverbsBackend) -> None:
    bid = next(_ids)
    entry = owner.call("register", bid, 4096, bid)
    _, region = _local(4096)
    with pytest.raises(ValueError, match=f"buffer {bid}"):
        _run(reader.read, entry, owner.peer(), region, 1)
    owner.call("unregister", bid)


def test_dropped_buffer_is_a_remote_access_error(owner: Owner, reader: IbverbsBackend) -> None:
    bid, other = next(_ids), next(_ids)
    entry = owner.call("register", bid, 4096, bid)
    other_entry = owner.call("register", other, 4096, other)
    dst, region = _local(4096)
    _run(reader.read, entry, owner.peer(), region, 0)
    owner.call("unregister", bid)

    with pytest.raises(IbverbsRemoteAccessError, match=f"buffer {bid} was dropped"):
        _run(reader.read, entry, owner.peer(), region, 0)
    with pytest.raises(IbverbsRemoteAccessError, match=f"buffer {bid}"):
        _run(reader.write, entry, owner.peer(), region, 0)

    # The failed queue pair was replaced: other buffers still work.
    _run(reader.read, other_entry, owner.peer(), region, 0)
    assert dst.raw == _pattern(other, 4096)
    owner.call("unregister", other)


def test_timeout_and_cancel_are_clean(owner: Owner, reader: IbverbsBackend) -> None:
    bid, nbytes = next(_ids), 16 << 20
    entry = owner.call("register", bid, nbytes, bid)
    dst, region = _local(nbytes)
    _small, small_region = _local(1)
    _run(reader.read, entry, owner.peer(), small_region, 0)  # connected before the clock starts

    reader.timeout = 1e-6
    try:
        with pytest.raises(IbverbsTimeout, match=f"buffer {bid}.*timed out"):
            _run(reader.read, entry, owner.peer(), region, 0)
    finally:
        reader.timeout = None

    # Connect first, so that the cancel lands on the transfer in flight, not on the connect.
    _run(reader.read, entry, owner.peer(), small_region, 0)

    async def cancelled_read() -> bool:
        with trio.move_on_after(1e-4) as scope:
            await reader.read(entry, owner.peer(), region, 0)
        return scope.cancelled_caught

    print(f"cancel caught the transfer: {_run(cancelled_read)}")

    # Both tore the queue pair down; the next transfer reconnects and is exact.
    _run(reader.read, entry, owner.peer(), region, 0)
    assert dst.raw == _pattern(bid, nbytes)
    owner.call("unregister", bid)


def test_dead_owner_is_a_clear_error(reader: IbverbsBackend) -> None:
    doomed = Owner()  # forked from a process with an open device: the at-fork guard matters
    try:
        bid = next(_ids)
        entry = doomed.call("register", bid, 1 << 20, bid)
        dst, region = _local(1 << 20)
        _run(reader.read, entry, doomed.peer(), region, 0)
        assert dst.raw == _pattern(bid, 1 << 20)

        os.kill(doomed.pid, signal.SIGKILL)
        start = time.monotonic()
        doomed.proc.join(30)
        print(f"dead owner reaped after {time.monotonic() - start:.2f} s", flush=True)
        start = time.monotonic()
        with pytest.raises(IbverbsPeerLost, match=f"owner pid {doomed.pid}"):
            _run(reader.read, entry, doomed.peer(), region, 0, timeout=120)
        elapsed = time.monotonic() - start
        assert elapsed < 60, elapsed
        print(f"dead owner reported after {elapsed:.2f} s")

        # Reconnecting goes through the owner, which is gone: an error, not a hang.
        with pytest.raises((EOFError, OSError)):
            _run(reader.read, entry, doomed.peer(), region, 0, timeout=60)
    finally:
        doomed.stop()
