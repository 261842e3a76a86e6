"""A large ``bytes`` in a message is registered in place: nobody can change it, so the sender
copies nothing (no snapshot file), and the receiver reads it once, straight into the new
``bytes`` it gets (docs/rdma.md, "Values in messages")."""

from __future__ import annotations

import ctypes
import hashlib

import pytest

import otpmesh
from otpmesh._node._node import current_node
from tests.conftest import reset_peak_rss, run_trio, vm_kib

MIB = 1 << 20


class Digest(otpmesh.Actor):
    @otpmesh.endpoint
    def digest(self, value: bytes) -> tuple[str, int]:
        return type(value).__name__, int.from_bytes(hashlib.sha256(value).digest()[:8], "big")


@pytest.mark.timeout(120)
def test_a_large_bytes_argument_is_sent_without_a_copy() -> None:
    big = bytes(range(256)) * (2 * MIB)  # 512 MiB, its pages all touched
    want = int.from_bytes(hashlib.sha256(big).digest()[:8], "big")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            actor = (await procs.spawn("d", Digest))[0]
            assert await actor.digest(b"warm" * MIB) is not None  # connections, channel, pools
            channel = current_node().channel  # type: ignore[union-attr]
            registry = channel.registry  # type: ignore[attr-defined]
            # What the channel registers for it: the bytes' own memory, no snapshot file.
            handle = channel.offer(memoryview(big), None)
            reg = registry.buffers[handle["id"]]
            assert reg.snapshot is None and reg.obj is big
            assert reg.region.address == ctypes.cast(ctypes.c_char_p(big), ctypes.c_void_p).value
            registry.drop(handle["id"])

            # And end to end: the receiver gets it whole; the sender made no memory file (a
            # snapshot would stay in its pool, warm for the next value) and no copy in its own
            # memory (its peak RSS barely moves).
            def files() -> tuple[int, int, int]:
                stats = registry.statistics()
                return stats.pooled, stats.reused, stats.mapped

            files_before = files()
            if not reset_peak_rss():
                pytest.skip("cannot reset the peak RSS here (/proc/self/clear_refs)")
            before = vm_kib("VmHWM")
            assert await actor.digest(big) == ("bytes", want)
            assert (vm_kib("VmHWM") - before) * 1024 < 64 * MIB
            assert files() == files_before

    run_trio(body, timeout=100)
