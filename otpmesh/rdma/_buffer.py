"""RDMABuffer: a registered region of an actor's memory, moved by handle.

The owner registers a contiguous tensor (or writable buffer); the small handle (``_handle.py``:
owner, buffer id, token, size) travels in messages; any process holding it reads or writes the
bytes one-sidedly through the best backend both ends can use. Before a transfer the reader pins
the buffer with its owner, presenting the token (so a ``drop`` or the owner's garbage collector
cannot free the memory mid-copy); the owner's answer, not the handle, says which process and
which memory the copy touches, and the backend is chosen (``_preference.choose``). Pins die with
the reader's connection, so a SIGKILLed reader leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any, ClassVar

import trio

from .._core._errors import ActorDiedError, OtpmeshError
from .._node._node import Node, current_node
from .._wire import _codec
from .._wire._connection import Connection
from ._backend import Peer, Region
from ._error import RDMAError
from ._handle import Grant, Handle, check_grant, check_matches, peer_pid
from ._pool import from_any_thread
from ._preference import allowed_backends, choose
from ._registry import registry
from ._target import describe_target

#: A reader's way to take a channel tensor without copying it: (backend, its entry in the grant,
#: the snapshot file the owner passed over the connection (this process's descriptor; the
#: caller closes it), what to call from any thread once the mapping is gone) -> the tensor, or
#: None to copy it.
Mapper = Callable[[str, dict[str, Any], int, Callable[[bool], None]], Any]

# ---------------------------------------------------------------- memory


def _unmapped(node: Node, conn: Connection, h: Handle) -> Callable[[bool], None]:
    """What tells the owner that this reader's mapping of `h`'s snapshot is gone (``forked``:
    a child process forked meanwhile may still map it, so the owner must never refill it)."""

    def end_lease(forked: bool) -> None:
        unmapped = {"op": "unmapped", "buffer": h.buffer, "token": h.token, "forked": forked}
        node.sys_cast(conn, "rdma", unmapped)

    return end_lease


# ---------------------------------------------------------------- the handle


class RDMABuffer:
    """A registered buffer of the calling actor's memory, or (when it arrived in a message) a
    handle to someone else's. ``await buf.read_into(t)``, ``await buf.write_from(t)``,
    ``buf.drop()``; ``buf.backend`` says what the last transfer used."""

    def __init__(self, data: Any) -> None:
        node = current_node()
        if node is None:
            raise RDMAError(
                "RDMABuffer needs a running otpmesh node: create it inside an actor, "
                "or in a controller after otpmesh.proc_mesh() or otpmesh.start()"
            )
        self._register_on(node, data)

    @classmethod
    def _offered(
        cls,
        node: Node,
        obj: Any,
        region: Region,
        dtype: str | None,
        shape: tuple[int, ...] | None,
        *,
        snapshot: bool,
    ) -> RDMABuffer:
        """A read-only buffer of a value in a message, registered with `node` (its channel
        offering it): `region`, the memory of `obj`, which nobody writes any more (a copy); or,
        with `snapshot`, a copy of `region` taken now into a memory file of the node's pool
        (``_snapshot.py``, ``_pool.py``)."""
        buf = cls.__new__(cls)
        reg_of = registry(node)
        if snapshot and region.nbytes:
            copy = reg_of.pool.take(region)
            try:
                buffer_id, reg = reg_of.register(
                    copy, copy.region, dtype, shape, snapshot=copy, writable=False
                )
            except BaseException:
                copy.close()
                raise
        else:
            buffer_id, reg = reg_of.register(obj, region, dtype, shape, writable=False)
        buf._adopt(node, buffer_id, reg.token, region.nbytes, dtype, shape, reg.grant)
        return buf

    def _register_on(self, node: Node, data: Any) -> None:
        region, dtype, shape = describe_target(data)
        dims = None if shape is None else tuple(shape)
        buffer_id, reg = registry(node).register(data, region, dtype, dims)
        self._adopt(node, buffer_id, reg.token, region.nbytes, dtype, dims, reg.grant)

    def _adopt(
        self,
        node: Node,
        buffer_id: int,
        token: str,
        nbytes: int,
        dtype: str | None,
        dims: tuple[int, ...] | None,
        grant: dict[str, Any],
    ) -> None:
        self._handle = Handle(
            buffer=buffer_id,
            token=token,
            owner=node.addr,
            nbytes=nbytes,
            dtype=dtype,
            shape=dims,
            backends=tuple(grant["entries"]),
        )
        self.backend: str | None = None

    _wire_ext: ClassVar[int] = _codec.EXT_RDMA_BUFFER  # how it travels (see _codec)

    def _to_wire(self) -> dict[str, Any]:
        return self._handle.to_wire()

    @classmethod
    def _from_wire(cls, data: Any) -> RDMABuffer:
        """Decode a handle from the wire: RDMAError if any field is malformed."""
        return cls._of(Handle.from_wire(data))

    @classmethod
    def _of(cls, handle: Handle) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._handle = handle
        buf.backend = None
        return buf

    @property
    def nbytes(self) -> int:
        return self._handle.nbytes

    @property
    def backends(self) -> list[str]:
        """The backends the owner offered for this buffer."""
        return list(self._handle.backends)

    def __repr__(self) -> str:
        h = self._handle
        where = f"buffer {h.buffer} of {h.owner}"
        return f"RDMABuffer({h.describe()}, {where}, backends {self.backends})"

    async def read_into(self, dst: Any, *, timeout: float | None = None) -> Any:
        """Copy the buffer's bytes into `dst` (same size, dtype and shape); return `dst`."""
        self._check(dst)
        await self._transfer(lambda: dst, "read", timeout)
        return dst

    async def write_from(self, src: Any, *, timeout: float | None = None) -> None:
        """Copy `src` (same size, dtype and shape) into the buffer."""
        self._check(src)
        await self._transfer(lambda: src, "write", timeout)

    async def _read_new(self, make: Callable[[], Any], mapped: Mapper | None = None) -> Any:
        """Read into what `make()` returns, called only once the owner vouched for the handle
        (so a forged handle cannot make this process allocate what it names); or, first, take
        what `mapped` returns, if anything (a snapshot mapped, not copied)."""
        return await self._transfer(make, "read", None, mapped)

    def drop(self) -> None:
        """Release the buffer: it can no longer be read or written (pinned transfers finish)."""
        node = current_node()
        if node is None:
            return
        h = self._handle
        if h.owner == node.addr:
            reg = registry(node)
            if h.buffer in reg.buffers:
                reg.check(h.buffer, h.token, live=False)
                reg.drop(h.buffer)
            return
        conn = node._side.get(h.owner) or node._conns.get(h.owner)
        if conn is not None:
            node.sys_cast(conn, "rdma", {"op": "drop", "buffer": h.buffer, "token": h.token})

    # ---------------------------------------------------------------- transfers

    def _check(self, local: Any) -> Region:
        region, dtype, shape = describe_target(local)
        h = self._handle
        held = None if h.shape is None else list(h.shape)
        if dtype is not None and h.dtype is not None and (dtype, shape) != (h.dtype, held):
            raise RDMAError(
                f"buffer {h.buffer} holds {h.dtype}{held}, the local tensor is {dtype}{shape}"
            )
        if region.nbytes != h.nbytes:
            raise RDMAError(
                f"buffer {h.buffer} holds {h.nbytes} bytes, the local one {region.nbytes}"
            )
        return region

    async def _transfer(
        self, make: Callable[[], Any], op: str, timeout: float | None, mapped: Mapper | None = None
    ) -> Any:
        node = current_node()
        if node is None:
            raise RDMAError(
                "transfers need a running otpmesh node (inside an actor, or a "
                "controller after otpmesh.proc_mesh() or otpmesh.start())"
            )
        h = self._handle
        try:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                if h.owner == node.addr:
                    return self._copy_locally(node, make, op)
                return await self._transfer_remote(node, make, op, mapped)
        except trio.TooSlowError:
            raise RDMAError(
                f"{op} of buffer {h.buffer} (owner {h.owner}) timed out after {timeout:g} s"
            ) from None

    def _copy_locally(self, node: Node, make: Callable[[], Any], op: str) -> Any:
        h = self._handle
        owned = registry(node)
        reg = owned.check(h.buffer, h.token)
        if op == "write":
            owned.check_write(h.buffer, reg)
        check_matches(h, reg.region.nbytes, reg.dtype, reg.shape)
        local = make()
        region = self._check(local)
        src, dst = (reg.region, region) if op == "read" else (region, reg.region)
        ctypes.memmove(dst.address, src.address, region.nbytes)
        self.backend = "local"
        return local

    async def _transfer_remote(
        self, node: Node, make: Callable[[], Any], op: str, mapped: Mapper | None
    ) -> Any:
        h = self._handle
        try:
            conn = await node.connect_side(h.owner)
        except (OSError, ValueError, OtpmeshError) as exc:  # ValueError: an address no socket takes
            raise RDMAError(
                f"the owner of buffer {h.buffer} ({h.owner}) is gone or unreachable: {exc}"
            ) from None

        async def request(backend_name: str, req: str, payload: Any) -> Any:
            return await node.sys_call(
                conn,
                "rdma",
                {
                    "op": "backend",
                    "buffer": h.buffer,
                    "token": h.token,
                    "backend": backend_name,
                    "request": req,
                    "payload": payload,
                },
                f"buffer {h.buffer}",
            )

        pin = {"op": "pin", "token": h.token, "write": op == "write", "memfd": mapped is not None}
        answer = await self._owner_call(node, conn, pin)
        mapped_it = False  # a mapping's lease outlives the pin: the owner must not refill it
        passed: int | None = None  # the snapshot file the owner passed with its answer
        try:
            grant = Grant.from_wire(answer)
            answered_by = peer_pid(conn.sock)
            check_grant(h, grant, answered_by)
            peer = Peer(grant.pid, grant.boot_id, grant.pidns, request)
            # Only the kernel's word (SO_PEERCRED, on a Unix socket) makes the grant's pid safe
            # to copy from or map: over TCP nothing vouches for it, so no same-host shortcut.
            verified = answered_by is not None
            shm = grant.entries.get("shm")
            if mapped is not None and isinstance(shm, dict):
                passed = conn.take_fd(shm.get("memfd"))
            if (
                mapped is not None
                and isinstance(shm, dict)
                and passed is not None
                and verified
                and "shm" in allowed_backends()
            ):
                # A memory file passed over this connection: mapped whichever backend would
                # copy (neither side reads the other's memory for it, so a non-dumpable reader
                # of a non-dumpable owner maps too). While pinned: the owner keeps what it names.
                taken = mapped("shm", shm, passed, from_any_thread(_unmapped(node, conn, h)))
                if taken is not None:
                    mapped_it = True
                    self.backend = "shm"
                    return taken
            name, backend = choose(registry(node).usable, grant, peer, verified, h.buffer)
            entry = grant.entries[name]
            local = make()
            region = self._check(local)
            try:
                if op == "read":
                    await backend.read(entry, peer, region, 0)
                else:
                    await backend.write(entry, peer, region, 0)
            except (OSError, ConnectionError, RuntimeError, ValueError, KeyError, TypeError) as exc:
                # RuntimeError: the ibverbs backend's errors (remote access, peer lost, timeout);
                # KeyError, TypeError: an entry the backend cannot use.
                raise RDMAError(f"{op} of buffer {h.buffer} over {name} failed: {exc!s}") from None
        finally:
            if passed is not None:  # mapped (the mapping holds the file) or not used
                os.close(passed)
            if not conn.closed:
                unpin = {"op": "unpin", "buffer": h.buffer, "mapped": mapped_it}
                node.sys_cast(conn, "rdma", unpin)
        self.backend = name
        return local

    async def _owner_call(self, node: Node, conn: Connection, request: dict[str, Any]) -> Any:
        h = self._handle
        try:
            return await node.sys_call(
                conn, "rdma", {**request, "buffer": h.buffer}, f"buffer {h.buffer}"
            )
        except ActorDiedError as exc:
            raise RDMAError(
                f"the owner of buffer {h.buffer} ({h.owner}) is gone: {exc.reason}"
            ) from None
        except OtpmeshError as exc:
            message = getattr(exc, "message", str(exc))
            raise RDMAError(message) from None
