"""One node's tensor-channel state: the backends this process can use, the buffers it owns, and
the pins readers hold on them (tied to their connections, so a dead reader leaves none).

Every request about a buffer presents its token: the owner answers a pin with a ``Grant`` (where
the buffer really is) only for the token it issued, so a forged or stale handle learns nothing
and moves nothing. A pin says whether it is for writing; a read-only buffer (a value sent in a
message) refuses that.

Temporary buffers (large values of messages) go when their readers are done: after as many
reads as the sender expects (``release_after``), or when the sender drops them, and at the
latest at their deadline (``expire``), which a task of the node's own enforces on trio's clock.

A temporary buffer's memory file (a snapshot, which readers of this host map) goes back to the
node's ``SnapshotPool`` when the buffer goes and the last reader's mapping is gone: the
registry keeps the leases (``_pool.py``) and the token of a forgotten buffer whose file some
reader still maps, so that reader's ``unmapped`` can still be checked."""

from __future__ import annotations

import importlib
import itertools
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from .._node._hostid import boot_id, pid_namespace
from .._node._node import Node, current_node
from .._wire._connection import Connection
from ._backend import Backend, Caller, Region
from ._error import RDMAError as RDMAError
from ._handle import Grant, new_token, peer_pid, tokens_match
from ._pool import SnapshotPool
from ._receive import ReceivePool
from ._shm import ShmBackend
from ._snapshot import Snapshot
from ._tcp import TcpBackend

#: Preference order: the first backend both ends can use wins.
PREFERENCE = ("cuda_ipc", "shm", "ibverbs", "tcp")


def allowed_backends() -> list[str]:
    """The backends this process may use, in preference order (OTPMESH_RDMA_BACKENDS)."""
    configured = os.environ.get("OTPMESH_RDMA_BACKENDS")
    if not configured:
        return list(PREFERENCE)
    names = [n.strip() for n in configured.split(",") if n.strip()]
    unknown = [n for n in names if n not in PREFERENCE]
    if unknown:
        raise RDMAError(
            f"OTPMESH_RDMA_BACKENDS names unknown backends {unknown}; "
            f"known: {', '.join(PREFERENCE)}"
        )
    return names


def _make_backends() -> dict[str, Backend]:
    made: dict[str, Backend] = {"shm": ShmBackend(), "tcp": TcpBackend()}
    try:  # imported by name: the ibverbs backend is optional (pyverbs, a device)
        ibverbs = importlib.import_module("otpmesh.rdma._ibverbs")
    except ImportError:
        pass
    else:
        made["ibverbs"] = ibverbs.IbverbsBackend()
    return made


@dataclass
class _Registered:
    obj: Any  # keeps the memory alive while registered or pinned
    region: Region
    token: str
    dtype: str | None
    shape: tuple[int, ...] | None
    grant: dict[str, Any]  # the answer to a pin: the only way the backends' entries leave
    pins: dict[int, int] = field(default_factory=dict)  # id(conn) -> count
    dropped: bool = False
    snapshot: Snapshot | None = None  # a channel tensor's copy (closed when forgotten)
    writable: bool = True  # False: a value sent in a message, which readers only read
    readers: int | None = None  # reads left before it is dropped (None: not counted)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryStatistics:
    """What a node's tensor channel holds now (``Registry.statistics()``)."""

    buffers: int  # registered, dropped but still pinned included
    pinned: int  # buffers some reader has pinned
    expiring: int  # temporary buffers waiting for their readers or their deadline
    snapshots: int  # memory files of registered buffers (each one descriptor, two mappings)
    mapped: int  # memory files of forgotten buffers that readers may still map
    pooled: int  # free memory files kept warm for the next value (``SnapshotPool``)
    reused: int  # values copied into a warm file, not a new one, since the node started
    receive_pooled: int  # free blocks of warm memory for values read from other hosts
    receive_reused: int  # values read into such a warm block since the node started


class Registry:
    """One node's tensor-channel state: its backends, and the buffers it owns."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.backends = _make_backends()
        self.usable = {n: b for n, b in self.backends.items() if b.unavailable() is None}
        self.buffers: dict[int, _Registered] = {}
        self._ids = itertools.count(1)
        self._holds = itertools.count(-1, -1)  # keys of the owner's own holds (_held)
        self._issued = 0  # the highest buffer id handed out
        self._host = (boot_id(), pid_namespace())  # read once: a pin must stay cheap
        self._expiring: dict[int, float] = {}  # buffer id -> deadline (trio's clock)
        self._next_expiry = math.inf  # when the expiry task wakes next
        self._expiry_wake: trio.Event | None = None  # None: the expiry task is not running
        self._changed = trio.Event()  # set (and replaced): a buffer forgotten, a lease ended
        self.pool = SnapshotPool()
        self.receive = ReceivePool(self._wake_expiry)
        self._mapped: dict[int, _Registered] = {}  # forgotten, but some reader maps its file
        node.sys_handlers["rdma"] = self._serve
        node.close_hooks.append(self._release_pins)

    def register(
        self,
        obj: Any,
        region: Region,
        dtype: str | None,
        shape: tuple[int, ...] | None,
        *,
        snapshot: Snapshot | None = None,
        writable: bool = True,
    ) -> tuple[int, _Registered]:
        """Register `region` (the memory of `obj`), for reads only unless `writable`. With
        `snapshot` (a channel tensor's copy, whose ``region`` this is), readers of this host may
        map it instead of copying it."""
        buffer_id = self._issued = next(self._ids)
        allowed = allowed_backends()
        entries = {
            n: b.register(buffer_id, region, writable=writable)
            for n, b in self.usable.items()
            if n in allowed
        }
        if snapshot is not None and "shm" in entries:
            # Readers of this host map the file: it is passed to each over its own connection
            # (``SCM_RIGHTS``, with the answer to its pin), named here by its inode.
            st = os.fstat(snapshot.fd)
            entries["shm"] = {**entries["shm"], "memfd": [st.st_dev, st.st_ino]}
        grant = Grant(
            pid=os.getpid(),
            boot_id=self._host[0],
            pidns=self._host[1],
            nbytes=region.nbytes,
            dtype=dtype,
            shape=shape,
            entries=entries,
        )
        reg = _Registered(
            obj,
            region,
            new_token(),
            dtype,
            shape,
            grant.to_wire(),
            snapshot=snapshot,
            writable=writable,
        )
        self.buffers[buffer_id] = reg
        return buffer_id, reg

    def check(self, buffer_id: Any, token: Any, *, live: bool = True) -> _Registered:
        """The buffer `buffer_id` if `token` is the one issued for it (and, when `live`, it is
        not dropped); else an RDMAError that says which."""
        if type(buffer_id) is not int or not isinstance(token, str):
            raise RDMAError(
                f"malformed tensor-channel request: buffer {buffer_id!r:.40}, token {token!r:.40}"
            )
        reg = self.buffers.get(buffer_id)
        if reg is None and not 0 < buffer_id <= self._issued:
            raise RDMAError(
                f"buffer {buffer_id} was never registered by its owner (a forged or stale "
                "handle); nothing was read or written"
            )
        if reg is None or (live and reg.dropped):
            raise RDMAError(f"buffer {buffer_id} was dropped by its owner")
        if not tokens_match(token, reg.token):
            raise RDMAError(
                f"buffer {buffer_id}: the handle's token is not the one its owner issued (a "
                "forged or stale handle); nothing was read or written"
            )
        return reg

    def check_write(self, buffer_id: int, reg: _Registered) -> None:
        """Refuse a write to a read-only buffer (a value sent in a message: other receivers
        may still read it, and its sender's snapshot must stay what was sent)."""
        if not reg.writable:
            raise RDMAError(
                f"buffer {buffer_id} is read-only: it holds a value sent in a message (a "
                "snapshot other receivers read too), so write_from is refused; write to an "
                "RDMABuffer its owner registered instead"
            )

    def expire(self, buffer_id: int, deadline: float) -> None:
        """Drop the temporary buffer `buffer_id` at `deadline` (trio's clock) at the latest,
        whatever its readers did (one died, a cast's target was unreachable)."""
        self._expiring[buffer_id] = deadline
        self._wake_expiry(deadline)
        if self.node.nursery is None:  # not serving: no task to wait in, sweep now
            self._drop_expired(trio.current_time())

    async def _expire_at_deadlines(self) -> None:
        """The node's expiry task: sleeps until the earliest deadline (a temporary buffer's, or
        a free snapshot file's), drops or closes what is due."""
        try:
            while True:
                now = trio.current_time()
                self._drop_expired(now)
                self.pool.trim(now)
                self.receive.trim(now)
                self._next_expiry = min(
                    min(self._expiring.values(), default=math.inf),
                    self.pool.next_trim(),
                    self.receive.next_trim(),
                )
                self._expiry_wake = wake = trio.Event()
                with trio.move_on_at(self._next_expiry):
                    await wake.wait()
        finally:  # the node stops: its files go (readers' mappings keep their pages)
            self._close_files()

    def _close_files(self) -> None:
        self.pool.trim()
        self.receive.close()
        for buffer_id in self.buffers:  # no backend serves from memory about to be unmapped
            self._unregister(buffer_id)
        for reg in [*self.buffers.values(), *self._mapped.values()]:
            if reg.snapshot is not None:
                reg.snapshot.close()
        self._mapped.clear()

    def _drop_expired(self, now: float) -> None:
        for old, when in list(self._expiring.items()):
            if when <= now:
                self.drop(old)

    def release_after(self, buffer_id: int, readers: int) -> None:
        """Drop the temporary buffer `buffer_id` once `readers` reads of it are over (a cast to
        that many actors): each reader's unpin counts, a dead reader's pins too."""
        reg = self.buffers.get(buffer_id)
        if reg is None or reg.dropped:
            return
        reg.readers = readers
        if readers <= 0:
            self.drop(buffer_id)

    def taken(self, buffer_id: int) -> None:
        """A reader of this process took the temporary buffer `buffer_id`: one read is over."""
        reg = self.buffers.get(buffer_id)
        if reg is not None:
            self._count_reads(buffer_id, reg, 1)

    def _count_reads(self, buffer_id: int, reg: _Registered, done: int) -> None:
        if reg.readers is not None and not reg.dropped:
            reg.readers -= done
            if reg.readers <= 0:
                self.drop(buffer_id)

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(
            buffers=len(self.buffers),
            pinned=sum(1 for reg in self.buffers.values() if reg.pins),
            expiring=len(self._expiring),
            snapshots=sum(1 for reg in self.buffers.values() if reg.snapshot is not None),
            mapped=len(self._mapped),
            pooled=self.pool.free,
            reused=self.pool.reused,
            receive_pooled=self.receive.free,
            receive_reused=self.receive.reused,
        )

    async def wait_changed(self) -> None:
        """Wait until a buffer is next forgotten or a lease ends (for a caller that waits for
        the registry to drain, without polling)."""
        await self._changed.wait()

    def drop(self, buffer_id: int) -> None:
        self._expiring.pop(buffer_id, None)
        reg = self.buffers.get(buffer_id)
        if reg is None or reg.dropped:
            return
        reg.dropped = True
        if not reg.pins:
            self._forget(buffer_id)

    def _forget(self, buffer_id: int) -> None:
        reg = self.buffers.pop(buffer_id, None)
        self._unregister(buffer_id)
        if reg is not None and reg.snapshot is not None:
            reg.snapshot.registered = False
            if reg.snapshot.leases:  # a reader may map it: keep its token for the unmapped
                self._mapped[buffer_id] = reg
            self._settle(reg.snapshot)
        self._note_change()

    def _unregister(self, buffer_id: int) -> None:
        for backend in self.usable.values():
            backend.unregister(buffer_id)

    def _note_change(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _settle(self, snap: Snapshot) -> None:
        self.pool.settle(snap, trio.current_time())
        if snap.fd >= 0 and not snap.registered and not snap.leases:
            self._wake_expiry(self.pool.next_trim())  # it waits free: close it when due

    def _wake_expiry(self, when: float) -> None:
        if when < self._next_expiry:
            self._next_expiry = when
            if self._expiry_wake is not None:
                self._expiry_wake.set()
        if self._expiry_wake is None and self.node.nursery is not None:
            self._expiry_wake = trio.Event()
            self.node.nursery.start_soon(self._expire_at_deadlines)
        elif self._expiry_wake is None:  # not serving: no task to wait for, free memory goes now
            self.pool.trim()
            self.receive.trim()

    def lease(self, reg: _Registered, key: int) -> None:
        """A reader (on connection `key`, or ``LOCAL``) may map `reg`'s snapshot from now."""
        if reg.snapshot is not None:
            reg.snapshot.leases[key] = reg.snapshot.leases.get(key, 0) + 1

    def unmapped(self, key: int, buffer_id: Any, token: Any, forked: Any = False) -> None:
        """A reader's mapping of the buffer's snapshot is gone: end one of its leases (and, when
        the reader `forked` a child while it was mapped, never refill the file: the child may
        still map it)."""
        reg = self.buffers.get(buffer_id) if type(buffer_id) is int else None
        if reg is None and type(buffer_id) is int:
            reg = self._mapped.get(buffer_id)
        if reg is None or reg.snapshot is None or not isinstance(token, str):
            return  # its file is gone already (orphaned and closed): nothing to end
        if not tokens_match(token, reg.token):
            raise RDMAError(f"buffer {buffer_id}: unmapped with a token its owner did not issue")
        if forked is not False and key in reg.snapshot.leases:
            reg.snapshot.orphaned = True
        self._end_lease(buffer_id, reg, key)

    def _end_lease(self, buffer_id: int, reg: _Registered, key: int) -> None:
        snap = reg.snapshot
        if snap is None or key not in snap.leases:
            return
        left = snap.leases.pop(key) - 1
        if left > 0:
            snap.leases[key] = left
        elif not snap.leases:
            self._mapped.pop(buffer_id, None)
        self._settle(snap)
        self._note_change()

    def _orphan(self, key: int) -> None:
        """Connection `key` closed: files it may still map are never refilled."""
        for buffer_id, reg in [*self.buffers.items(), *self._mapped.items()]:
            snap = reg.snapshot
            if snap is not None and snap.leases.pop(key, None) is not None:
                snap.orphaned = True
                if not snap.leases:
                    self._mapped.pop(buffer_id, None)
                self._settle(snap)
                self._note_change()

    def _release_pins(self, conn: Connection) -> None:
        self._orphan(id(conn))
        for buffer_id, reg in list(self.buffers.items()):
            held = reg.pins.pop(id(conn), None)
            if held is None:
                continue
            if reg.dropped and not reg.pins:
                self._forget(buffer_id)
            else:  # a reader that died mid-read will not read again
                self._count_reads(buffer_id, reg, held)

    async def _serve(self, conn: Connection | None, p: Any) -> Any:
        if not isinstance(p, dict):
            raise RDMAError(f"malformed tensor-channel request: {p!r:.80}")
        op, token = p.get("op"), p.get("token")
        buffer_id: Any = p.get("buffer")
        key = id(conn)
        if op == "pin":  # the token check: only its issuer's token learns where the buffer is
            reg = self.check(buffer_id, token)
            if p.get("write", False) is not False:
                self.check_write(buffer_id, reg)
            if p.get("memfd") is True and reg.snapshot is not None and conn is not None:
                if conn.passes_fds:  # a Unix socket: this host
                    conn.pass_fd(reg.snapshot.fd)  # arrives no later than this answer
            reg.pins[key] = reg.pins.get(key, 0) + 1
            self.lease(reg, key)  # a reader of this host may map its snapshot
            return reg.grant
        if op == "backend":  # set-up a backend needs (an ibverbs queue pair): token holders only
            reg = self.check(buffer_id, token, live=False)
            name = p.get("backend")
            backend = self.usable.get(name) if isinstance(name, str) else None
            if backend is None:
                raise RDMAError(f"this owner has no tensor-channel backend {name!r:.40}")
            caller = Caller(
                pid=None if conn is None else peer_pid(conn.sock),
                region=reg.region,
                writable=reg.writable,
                pinned=key in reg.pins,
            )
            request, payload = str(p.get("request")), p.get("payload")
            if not caller.pinned:
                return await backend.serve(request, payload, caller)
            with self._held(buffer_id, reg):  # the owner copies: that pin must outlive it
                return await backend.serve(request, payload, caller)
        found = self.buffers.get(buffer_id) if type(buffer_id) is int else None
        if op == "unpin":  # only this connection's own pins
            if found is not None and key in found.pins:
                if p.get("mapped", True) is False:  # it copied: its lease ends with the pin
                    self._end_lease(buffer_id, found, key)
                self._unpin(buffer_id, found, key)
            return True
        if op == "unmapped":
            self.unmapped(key, buffer_id, token, p.get("forked", False))
            return True
        if op == "drop":
            if found is not None:  # dropping twice, or after the owner did, is no error
                self.check(buffer_id, token, live=False)
                self.drop(buffer_id)
            return True
        raise RDMAError(f"unknown tensor-channel request {op!r:.40}")

    @contextmanager
    def _held(self, buffer_id: int, reg: _Registered) -> Iterator[None]:
        """A pin and a lease of `reg` of its own while the owner copies for a reader (a push
        copy runs in threads): the reader's unpin, a drop, or its connection's close meanwhile
        can neither forget the buffer nor refill or unmap its snapshot under the copy. Its key
        is no connection's, so nothing but the end of the copy releases it."""
        hold = next(self._holds)  # negative: never a connection's id(conn) key
        reg.pins[hold] = 1
        self.lease(reg, hold)
        try:
            yield
        finally:
            reg.pins.pop(hold, None)
            self._end_lease(buffer_id, reg, hold)
            if reg.dropped and not reg.pins and self.buffers.get(buffer_id) is reg:
                self._forget(buffer_id)

    def _unpin(self, buffer_id: int, reg: _Registered, key: int) -> None:
        if key not in reg.pins:
            return  # not this connection's pin: nothing to release, no read to count
        left = reg.pins[key] - 1
        if left > 0:
            reg.pins[key] = left
        else:
            reg.pins.pop(key, None)
        if reg.dropped and not reg.pins:
            self._forget(buffer_id)
        else:
            self._count_reads(buffer_id, reg, 1)


def registry(node: Node) -> Registry:
    """`node`'s buffers and backends: its tensor channel's registry."""
    found = getattr(node.channel, "registry", None)
    if not isinstance(found, Registry):
        raise RDMAError(
            f"this otpmesh node ({node.addr}) was made without a tensor channel; "
            "RDMABuffer works in the controller and in actors"
        )
    return found


def backends() -> list[str]:
    """The backends this process can use now, in preference order."""
    node = current_node()
    usable = (
        registry(node).usable
        if node is not None
        else {n: b for n, b in _make_backends().items() if b.unavailable() is None}
    )
    return [n for n in allowed_backends() if n in usable]
