"""The ``shm`` backend: CPU memory between processes of one host, copied by the kernel
(``process_vm_readv`` / ``process_vm_writev``) straight from the owner's tensor into the reader's.

Nothing is allocated or named for it: no shared-memory segment or file exists, so a SIGKILLed
owner or reader cannot leave one behind. "Same host" is decided by boot id and PID namespace,
not by hostname.

The entry (address and size) and the pid come from the owner's answer to a pin (``Grant``), never
from a handle: see ``_handle.py``.

Only a dumpable owner can be read this way. The controller and host agents are not dumpable (no
actor may read them: ``_core/_dumpable.py``), so their entries say ``push``: the reader sends the
address of its own memory (``copy``, over its connection, for token holders with a pin) and the
owner copies into it (or out of it, for a write) with ``process_vm_writev`` / ``process_vm_readv``
on the reader, a dumpable process of the same user: the same kernel copy, one round trip more.
The owner copies only to or from the pid the kernel names for that connection (``SO_PEERCRED``),
only inside the pinned buffer, and only what the pin allows.

A confined worker (its own Landlock domain: ``_core/_sandbox.py``) may not read or write another
process's memory at all, and no other worker may read or write its: only processes outside every
domain may (the controller, a host agent). So a confined reader asks the owner to copy (as for a
non-dumpable owner), a confined owner's entry says ``confined`` (it copies for nobody), and
between two confined workers this backend does not reach: the channel takes the next one.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any, ClassVar

import trio

from .._core._dumpable import dumpable
from .._core._errors import OtpmeshError
from .._core._sandbox import confined
from .._node._hostid import boot_id, pid_namespace
from ._backend import Caller, Peer, Region

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
                raise ShmError(err, f"process {pid} (the other end of the copy) is gone")
            raise ShmError(
                err,
                f"cannot {'write' if write else 'read'} the memory of process {pid}: "
                f"{os.strerror(err)}",
            )
        if moved == 0:
            raise ShmError(errno.EFAULT, f"the memory region of process {pid} ended early")
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
        entry: dict[str, Any] = {"address": region.address, "nbytes": region.nbytes}
        if not dumpable():  # readers cannot reach this process: it copies for them
            entry = {"nbytes": region.nbytes, "push": True}
        if confined():  # nor can it reach theirs: only an unconfined reader copies
            entry["confined"] = True
        return entry

    def unregister(self, buffer_id: int) -> None:
        return None

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        if (peer.boot_id, peer.pid_namespace) != self._host:
            return False
        # One side must reach the other's memory (or it is itself: two nodes of one process).
        return peer.pid == os.getpid() or self._reads(entry) or self._pushes_to_me(entry)

    @staticmethod
    def _reads(entry: dict[str, Any]) -> bool:
        """Whether this process can copy the owner's memory itself: the owner is dumpable (its
        entry names an address) and this process is in no sandbox."""
        return entry.get("push") is not True and not confined()

    @staticmethod
    def _pushes_to_me(entry: dict[str, Any]) -> bool:
        """Whether the owner can copy into this process for it: the owner is in no sandbox, and
        this process is dumpable."""
        return entry.get("confined") is not True and dumpable()

    @staticmethod
    def _asks(entry: dict[str, Any], peer: Peer) -> bool:
        """Whether the owner copies (its entry names no address, or this confined process may
        not read another's memory) rather than this process."""
        return entry.get("push") is True or (peer.pid != os.getpid() and confined())

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        if self._asks(entry, peer):
            await self._ask(peer, dst, offset, write=False)
            return
        await self._run(peer.pid, dst, _remote(entry, offset, dst.nbytes), write=False)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        if self._asks(entry, peer):
            await self._ask(peer, src, offset, write=True)
            return
        await self._run(peer.pid, src, _remote(entry, offset, src.nbytes), write=True)

    @staticmethod
    async def _ask(peer: Peer, local: Region, offset: int, *, write: bool) -> None:
        """Have a non-dumpable owner copy between its buffer and `local` (in this process)."""
        copy = {"address": local.address, "nbytes": local.nbytes, "offset": offset, "write": write}
        try:
            await peer.request("shm", "copy", copy)
        except OtpmeshError as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise ShmError(errno.EIO, f"the owner could not copy: {message}") from None

    async def serve(self, op: str, payload: Any, caller: Caller) -> Any:
        if op != "copy" or type(payload) is not dict:
            raise ValueError(f"the shm backend has no request {op!r:.40}")
        if caller.pid is None or not caller.pinned:
            raise ShmError(
                errno.EPERM,
                "an shm copy needs a pin held on a Unix connection of this host (the kernel "
                "names the process to copy to); pin the buffer first",
            )
        address, nbytes = payload.get("address"), payload.get("nbytes")
        offset, write = payload.get("offset"), payload.get("write")
        if (
            type(address) is not int
            or type(nbytes) is not int
            or type(offset) is not int
            or type(write) is not bool
        ):
            raise ValueError(f"malformed shm copy request: {payload!r:.120}")
        if write and not caller.writable:
            raise ShmError(errno.EPERM, "this buffer is read-only: the pin was for reading")
        mine = caller.region
        if offset < 0 or nbytes < 0 or offset + nbytes > mine.nbytes:
            raise ValueError(f"{nbytes} bytes at offset {offset} fall outside its {mine.nbytes}")
        # The reader's write comes out of its memory into ours; its read goes into its memory.
        here = Region(mine.address + offset, nbytes)
        await self._run(caller.pid, here, address, write=not write)
        return True

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
