"""The owner's answers to its readers' tensor-channel requests (the node operation ``rdma``):
``pin`` (only the token its owner issued learns where the buffer is), ``backend`` (set-up a
backend needs, such as an ibverbs queue pair), ``unpin``, ``unmapped`` and ``drop``; and the
owner's own hold on a buffer while it copies for a reader."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._node._node import Node
from .._wire._connection import Connection
from ._backend import Caller
from ._error import RDMAError
from ._handle import peer_pid
from ._registered import Registered
from ._registry import Registry


class ServingRegistry(Registry):
    """A node's registry that answers its readers' requests, from its making on."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        node.sys_handlers["rdma"] = self._serve

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
                    self.end_lease(buffer_id, found, key)
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
    def _held(self, buffer_id: int, reg: Registered) -> Iterator[None]:
        """A pin and a lease of `reg` of its own while the owner copies for a reader (a push
        copy runs in threads): the reader's unpin, a drop, or its connection's close meanwhile
        can neither forget the buffer nor refill or unmap its snapshot under the copy. Its key
        is no connection's, so nothing but the end of the copy releases it."""
        hold = next(self.holds)  # negative: never a connection's id(conn) key
        reg.pins[hold] = 1
        self.lease(reg, hold)
        try:
            yield
        finally:
            reg.pins.pop(hold, None)
            self.end_lease(buffer_id, reg, hold)
            if reg.dropped and not reg.pins and self.buffers.get(buffer_id) is reg:
                self.forget(buffer_id)

    def _unpin(self, buffer_id: int, reg: Registered, key: int) -> None:
        if key not in reg.pins:
            return  # not this connection's pin: nothing to release, no read to count
        left = reg.pins[key] - 1
        if left > 0:
            reg.pins[key] = left
        else:
            reg.pins.pop(key, None)
        if reg.dropped and not reg.pins:
            self.forget(buffer_id)
        else:
            self.count_reads(buffer_id, reg, 1)
