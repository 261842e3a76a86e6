"""One node's tensor-channel state: the backends this process can use, the buffers it owns, and
the pins readers hold on them (tied to their connections, so a dead reader leaves none).

Every request about a buffer presents its token (``check``): the owner answers a pin with a
``Grant`` (where the buffer really is) only for the token it issued, so a forged or stale handle
learns nothing and moves nothing. A pin says whether it is for writing; a read-only buffer (a
value sent in a message) refuses that. The requests are answered in ``_requests.py``.

Temporary buffers (large values of messages) go when their readers are done: after as many
reads as the sender expects (``release_after``), or when the sender drops them, and at the
latest at their deadline (``expire``), which a task of the node's own enforces on trio's clock.

A temporary buffer's memory file (a snapshot, which readers of this host map) goes back to the
node's ``SnapshotPool`` when the buffer goes and the last reader's mapping is gone: the
registry keeps the leases (``_pool.py``) and the token of a forgotten buffer whose file some
reader still maps, so that reader's ``unmapped`` can still be checked."""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import trio

from .._node._hostid import boot_id, pid_namespace
from .._node._node import Node, current_node
from .._wire._connection import Connection
from ._backend import Region
from ._error import RDMAError
from ._handle import Grant, new_token, tokens_match
from ._pool import SnapshotPool
from ._preference import allowed_backends, make_backends
from ._receive import ReceivePool
from ._registered import Registered, RegistryStatistics
from ._snapshot import Snapshot


class Registry:
    """One node's tensor-channel state: its backends, and the buffers it owns."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.backends = make_backends()
        self.usable = {n: b for n, b in self.backends.items() if b.unavailable() is None}
        self.buffers: dict[int, Registered] = {}
        self._ids = itertools.count(1)
        self.holds = itertools.count(
            -1, -1
        )  # keys of the owner's own holds (``ServingRegistry._held``)
        self._issued = 0  # the highest buffer id handed out
        self._host = (boot_id(), pid_namespace())  # read once: a pin must stay cheap
        self._expiring: dict[int, float] = {}  # buffer id -> deadline (trio's clock)
        self._next_expiry = math.inf  # when the expiry task wakes next
        self._expiry_wake: trio.Event | None = None  # None: the expiry task is not running
        self._changed = trio.Event()  # set (and replaced): a buffer forgotten, a lease ended
        self.pool = SnapshotPool()
        self.receive = ReceivePool(self._wake_expiry)
        self._mapped: dict[int, Registered] = {}  # forgotten, but some reader maps its file
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
    ) -> tuple[int, Registered]:
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
        reg = Registered(
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

    def check(self, buffer_id: Any, token: Any, *, live: bool = True) -> Registered:
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

    def check_write(self, buffer_id: int, reg: Registered) -> None:
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
            self.count_reads(buffer_id, reg, 1)

    def count_reads(self, buffer_id: int, reg: Registered, done: int) -> None:
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
            self.forget(buffer_id)

    def forget(self, buffer_id: int) -> None:
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

    def lease(self, reg: Registered, key: int) -> None:
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
        self.end_lease(buffer_id, reg, key)

    def end_lease(self, buffer_id: int, reg: Registered, key: int) -> None:
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
                self.forget(buffer_id)
            else:  # a reader that died mid-read will not read again
                self.count_reads(buffer_id, reg, held)


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
        else {n: b for n, b in make_backends().items() if b.unavailable() is None}
    )
    return [n for n in allowed_backends() if n in usable]
