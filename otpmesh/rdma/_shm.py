"""The ``shm`` backend: CPU memory between processes of one host, copied by the kernel
(``process_vm_readv`` / ``process_vm_writev``) straight from the owner's tensor into the reader's.

Nothing is allocated or named for it: no shared-memory segment or file exists, so a SIGKILLed
owner or reader cannot leave one behind. "Same host" is decided by boot id and PID namespace,
not by hostname.

The entry (address and size) and the pid come from the owner's answer to a pin (``Grant``), never
from a handle: see ``_handle.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, ClassVar

import trio

from .._node._hostid import boot_id, pid_namespace
from ._backend import Peer, Region

_libc = ctypes.CDLL(None, use_errno=True)
# Big copies run in a thread, so the node keeps serving while the kernel copies.
_THREAD_ABOVE = 1 << 20
_CHUNK = 1 << 30  # process_vm_readv moves at most about this much per call anyway
_THREADS = os.cpu_count() or 1


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class ShmError(OSError):
    """Raised by the shm backend when the kernel refuses a copy (owner gone, memory gone)."""


def _copy(pid: int, local: Region, remote_address: int, write: bool) -> None:
    call = _libc.process_vm_writev if write else _libc.process_vm_readv
    done = 0
    while done < local.nbytes:
        n = min(_CHUNK, local.nbytes - done)
        here = _IoVec(local.address + done, n)
        there = _IoVec(remote_address + done, n)
        moved = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if moved < 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise ShmError(err, f"the owner process {pid} is gone")
            raise ShmError(
                err, f"cannot {'write' if write else 'read'} the owner's memory: {os.strerror(err)}"
            )
        if moved == 0:
            raise ShmError(errno.EFAULT, "the owner's memory region ended early")
        done += moved


def _remote(entry: dict[str, Any], offset: int, nbytes: int) -> int:
    """The owner's address to copy at, after checking the copy stays inside its buffer."""
    address, size = int(entry["address"]), int(entry["nbytes"])
    if offset < 0 or offset + nbytes > size:
        raise ValueError(f"{nbytes} bytes at offset {offset} fall outside its {size} bytes")
    return address + offset


class ShmBackend:
    name: ClassVar[str] = "shm"

    def __init__(self) -> None:
        self._host = (boot_id(), pid_namespace())  # read once: asked on every transfer

    def unavailable(self) -> str | None:
        if not hasattr(_libc, "process_vm_readv"):
            return "process_vm_readv is not available (not Linux)"
        return None

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        # Read-only buffers: the owner refuses a pin for writing (``Registry``); a channel
        # snapshot's pages are not even writable (``process_vm_writev`` fails with EFAULT).
        return {"address": region.address, "nbytes": region.nbytes}

    def unregister(self, buffer_id: int) -> None:
        return None

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        return (peer.boot_id, peer.pid_namespace) == self._host

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        await self._run(peer.pid, dst, _remote(entry, offset, dst.nbytes), write=False)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        await self._run(peer.pid, src, _remote(entry, offset, src.nbytes), write=True)

    async def serve(self, op: str, payload: Any) -> Any:
        raise ValueError(f"the shm backend has no request {op!r}")

    @staticmethod
    async def _run(pid: int, local: Region, remote_address: int, write: bool) -> None:
        if local.nbytes <= _THREAD_ABOVE:
            _copy(pid, local, remote_address, write)
            await trio.lowlevel.checkpoint()
            return
        # Big copies: one thread per core, each moving its own slice (one core cannot saturate
        # memory bandwidth with a single copy).
        parts = max(1, min(_THREADS, local.nbytes // _THREAD_ABOVE))
        step = -(-local.nbytes // parts) // 4096 * 4096 or local.nbytes
        async with trio.open_nursery() as nursery:
            for start in range(0, local.nbytes, step):
                piece = Region(local.address + start, min(step, local.nbytes - start))
                nursery.start_soon(
                    trio.to_thread.run_sync, _copy, pid, piece, remote_address + start, write
                )
