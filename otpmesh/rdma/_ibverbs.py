"""The ``ibverbs`` backend: one-sided RDMA READ/WRITE on RC queue pairs, through pyverbs.

Owner side: ``register`` registers the buffer's existing memory as one memory region (MR) with
remote read/write access (read only, for a read-only buffer: a tensor sent in a message), once per
buffer, and returns what a reader needs as this backend's entry (device, port, GID/LID, rkey,
address, size). The entry reaches a reader only in the owner's answer to a pin that presented the
buffer's token (``_handle.Grant``), never in the handle. ``serve("connect", ...)`` creates the
owner's half of a reliable-connected (RC) queue pair for one reader and moves it to RTR/RTS.

Reader side: one RC queue pair per (reader process, owner process), created on first use through
``peer.request("ibverbs", "connect", ...)`` and cached. Each transfer registers the local region for
its own duration (see ``_local_mr`` for why not cached), posts signaled RDMA READ/WRITE work
requests and polls their completions from trio without blocking the loop. The owner's CPU takes
no part in the transfer itself.

Failure semantics (each is an exception, never a hang): a dropped buffer (MR deregistered, so its
rkey is invalid) completes with a remote access error; a dead owner (its QP destroyed by the
kernel) stops answering and the RC transport gives up after its retries (ACK timeout 14, about
67 ms, times 8 tries); a deadline (``timeout=`` or the caller's trio cancel scope) tears the queue
pair down first so no late DMA can touch the local memory after we return. After any failure the
queue pair is destroyed and the next transfer connects afresh.

pyverbs and the device are ``_verbs.py``'s; queue pairs and the transfer loop ``_queuepair.py``'s.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import random
import time
import weakref
from typing import Any, ClassVar

import trio

from .._node._hostid import boot_id, pid_namespace
from ._backend import Caller, Peer, Region
from ._queuepair import MAX_SEND_WR, Conn, create_qp, start_time, to_rts, transfer
from ._verbs import Device, IbverbsError, close_quietly, enums, open_device, probe, pyverbs

# The deadline when no timeout is set: _BACKSTOP_S plus the size at _BACKSTOP_RATE bytes/s.
_BACKSTOP_S = 30.0
_BACKSTOP_RATE = 10e6


class IbverbsBackend:
    """The ibverbs Backend (see ``_backend.Backend``); one instance per process."""

    name: ClassVar[str] = "ibverbs"

    def __init__(self, timeout: float | None = None) -> None:
        # None: a backstop deadline that grows with the size (see _deadline); the RC transport
        # bounds a silent peer by its retries and the caller's trio cancel scope is the real
        # limit; every path tears the QP down safely.
        self.timeout = timeout
        self._unavailable: str | None = None
        self._probed = False
        self._device_name = ""  # the device the probe vouched for
        self._dev: Device | None = None
        self._pid = os.getpid()
        # owner side
        self._mrs: dict[int, Any] = {}
        self._served_cq: Any = None
        self._served: dict[tuple[str, str, int], list[Any]] = {}
        self.connects_served = 0  # for tests and diagnostics: QPs set up on request
        # reader side
        self._conns: dict[tuple[str, str, int], Conn] = {}
        self._locks: dict[tuple[str, str, int], trio.Lock] = {}
        self._wr_ids = itertools.count(1)
        ref = weakref.ref(self)
        atexit.register(_close_ref, ref)
        os.register_at_fork(after_in_child=lambda: _forget_ref(ref))

    # ---- availability -------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        if not self._probed:
            self._unavailable = self._probe()
            self._probed = True
        return self._unavailable

    def _probe(self) -> str | None:
        why, self._device_name = probe()
        return why

    def _device(self) -> Device:
        if self._dev is not None:
            return self._dev
        why = self.unavailable()
        if why is not None:
            raise IbverbsError(f"ibverbs is unavailable here: {why}")
        self._dev = open_device(self._device_name)
        return self._dev

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        dev = self._device()
        if buffer_id in self._mrs:
            raise IbverbsError(f"buffer {buffer_id} is already registered")
        rkey = 0
        if region.nbytes > 0:  # a zero-length MR is invalid; nothing to reach anyway
            pv, e = pyverbs(), enums()
            access = (
                e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
                if writable
                else e.IBV_ACCESS_REMOTE_READ  # the NIC refuses writes (a remote access error)
            )
            # Registers (and pins) the tensor's own pages: no copy, no allocation.
            mr = pv.mr.MR(dev.pd, region.nbytes, access, address=region.address)
            self._mrs[buffer_id] = mr
            rkey = int(mr.rkey)
        return {
            "buffer": buffer_id,
            "device": dev.name,
            "port": dev.port,
            "gid": dev.gid,
            "lid": dev.lid,
            "ethernet": dev.ethernet,
            "roce_v2": dev.roce_v2,
            "boot_id": boot_id(),
            "rkey": rkey,
            "address": region.address,
            "nbytes": region.nbytes,
        }

    def unregister(self, buffer_id: int) -> None:
        mr = self._mrs.pop(buffer_id, None)
        if mr is not None:
            # From here on the rkey is invalid: a reader's access completes with a remote
            # access error instead of touching memory that may be reused.
            mr.close()

    async def serve(self, op: str, payload: Any, caller: Caller) -> Any:
        if op != "connect":
            raise IbverbsError(f"unknown ibverbs request {op!r}")
        dev = self._device()
        pv = pyverbs()
        reader = (str(payload["reader"][0]), str(payload["reader"][1]), int(payload["reader"][2]))
        self._forget_dead_readers()
        # A reader reconnects only after its previous QP failed: that one is useless now.
        for old in self._served.pop(reader, []):
            close_quietly(old)
        if self._served_cq is None:
            # Responder-side RDMA READ/WRITE produce no completions; the QP still needs a CQ.
            self._served_cq = pv.cq.CQ(dev.ctx, 1, None, None, 0)
        qp = create_qp(dev, self._served_cq, max_send_wr=1)
        psn = random.getrandbits(24)
        try:
            to_rts(
                dev,
                qp,
                payload,
                my_psn=psn,
                max_rd_atomic=1,
                max_dest_rd_atomic=dev.max_dest_rd_atomic,
                remote_access=True,
            )
        except BaseException:
            close_quietly(qp)
            raise
        self._served[reader] = [qp]
        self.connects_served += 1
        return {
            "qpn": int(qp.qp_num),
            "psn": psn,
            "gid": dev.gid,
            "lid": dev.lid,
            "mtu": dev.mtu,
            "rd_atomic": dev.max_dest_rd_atomic,
        }

    def _forget_dead_readers(self) -> None:
        """Close QPs served to readers of this host (and pid namespace) that no longer exist; a
        reader that died leaves its owner's half of the QP behind otherwise."""
        here = (boot_id(), pid_namespace())
        for key in list(self._served):
            if key[:2] != here:
                continue
            try:
                os.kill(key[2], 0)
            except ProcessLookupError:
                for qp in self._served.pop(key):
                    close_quietly(qp)
            except PermissionError:
                pass

    # ---- reader side --------------------------------------------------------------------------

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        """Honest but optimistic: the first connect proves it (a wrong yes is an error, not a
        hang). Same host: always (the device loops back). Otherwise InfiniBand needs the same
        subnet prefix (no IB routers assumed); RoCEv2 is IP-routed, so both ends on RoCEv2 is
        enough; RoCEv1 is one L2 segment we cannot verify, so no."""
        if self.unavailable() is not None or "gid" not in entry:
            return False
        try:
            dev = self._device()
        except Exception:
            return False
        if bool(entry["ethernet"]) != dev.ethernet:
            return False
        if peer.boot_id and peer.boot_id == boot_id():
            return True
        if not dev.ethernet:
            return str(entry["gid"])[:19] == dev.gid[:19]  # the 64-bit subnet prefix
        return bool(entry["roce_v2"]) and dev.roce_v2

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        await self._transfer("read", entry, peer, dst, offset)

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        await self._transfer("write", entry, peer, src, offset)

    async def _transfer(
        self, op: str, entry: dict[str, Any], peer: Peer, local: Region, offset: int
    ) -> None:
        what = f"RDMA {op.upper()} of buffer {entry['buffer']} (owner pid {peer.pid})"
        if offset < 0 or offset + local.nbytes > int(entry["nbytes"]):
            raise ValueError(
                f"{what}: {local.nbytes} bytes at offset {offset} fall outside its "
                f"{entry['nbytes']} bytes"
            )
        if local.nbytes == 0:
            return
        limit = self.timeout
        if limit is None:
            # Only so that a transport that never completes (a device or driver bug) cannot hang
            # the caller forever: generous, 30 s plus 10 MB/s, far below any real link's speed.
            limit = _BACKSTOP_S + local.nbytes / _BACKSTOP_RATE
        deadline = time.monotonic() + limit
        dev = self._device()
        conn = await self._connection(dev, entry, peer)
        mr = self._local_mr(dev, local, writable=op == "read")
        try:
            which = "timeout" if self.timeout is not None else "backstop"
            await transfer(
                dev, conn, op, entry, local, offset, mr, self._wr_ids, deadline, limit, what, which
            )
        except BaseException as exc:
            # Error, timeout or cancellation with work possibly in flight: destroying the QP
            # stops the device from touching `local` before its MR goes away below.
            conn.teardown(f"{what} failed: {exc!r}")
            if self._conns.get(_peer_key(peer)) is conn:
                del self._conns[_peer_key(peer)]
            raise
        finally:
            mr.close()

    def _local_mr(self, dev: Device, local: Region, writable: bool) -> Any:
        """Register the reader's region for this transfer only. A cache keyed by address would
        be wrong without memory hooks: freed and reused memory keeps the old pinned pages, and
        the device would then write where nobody looks (silent corruption)."""
        pv, e = pyverbs(), enums()
        # Reading a remote buffer writes local memory; writing one only reads it (so read-only
        # memory can be a source).
        access = e.IBV_ACCESS_LOCAL_WRITE if writable else 0
        return pv.mr.MR(dev.pd, local.nbytes, access, address=local.address)

    async def _connection(self, dev: Device, entry: dict[str, Any], peer: Peer) -> Conn:
        key = _peer_key(peer)
        conn = self._conns.get(key)
        if conn is not None and conn.dead is None:
            return conn
        # One connect per owner even when several tasks start transfers at once.
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            conn = self._conns.get(key)
            if conn is not None and conn.dead is None:
                return conn
            pv = pyverbs()
            cq = pv.cq.CQ(dev.ctx, MAX_SEND_WR + 1, None, None, 0)
            try:
                qp = create_qp(dev, cq, max_send_wr=MAX_SEND_WR)
            except BaseException:
                close_quietly(cq)
                raise
            conn = Conn(qp=qp, cq=cq)
            if peer.boot_id == boot_id() and peer.pid_namespace == pid_namespace():
                started = start_time(peer.pid)
                if started is not None:
                    conn.owner = (peer.pid, started)
            psn = random.getrandbits(24)
            try:
                answer = await peer.request(
                    self.name,
                    "connect",
                    {
                        "reader": [boot_id(), pid_namespace(), os.getpid()],
                        "qpn": int(qp.qp_num),
                        "psn": psn,
                        "gid": dev.gid,
                        "lid": dev.lid,
                        "mtu": dev.mtu,
                        "rd_atomic": dev.max_rd_atomic,
                        "buffer": entry["buffer"],
                    },
                )
                to_rts(
                    dev,
                    qp,
                    answer,
                    my_psn=psn,
                    max_rd_atomic=min(dev.max_rd_atomic, int(answer["rd_atomic"])),
                    max_dest_rd_atomic=1,
                    remote_access=False,
                )
            except BaseException:
                conn.teardown("connect failed")
                raise
            self._conns[key] = conn
            return conn

    # ---- queue pairs --------------------------------------------------------------------------

    # ---- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy every verbs object of this process (QPs, MRs, CQs, PD, context)."""
        if os.getpid() != self._pid:
            return  # inherited across fork: the parent's objects are not ours to destroy
        for conn in self._conns.values():
            conn.teardown("backend closed")
        self._conns.clear()
        for qps in self._served.values():
            for qp in qps:
                close_quietly(qp)
        self._served.clear()
        for mr in self._mrs.values():
            close_quietly(mr)
        self._mrs.clear()
        dev, self._dev = self._dev, None
        for obj in (self._served_cq, dev.pd if dev else None, dev.ctx if dev else None):
            if obj is not None:
                close_quietly(obj)
        self._served_cq = None

    def _forget_after_fork(self) -> None:
        """In a forked child: the verbs objects belong to the parent (same uverbs file, so
        destroying them here would destroy the parent's). Keep them alive forever instead, and
        start from nothing; the child opens its own context on first use."""
        held: list[Any] = []
        for conn in self._conns.values():
            held += [conn.qp, conn.cq]
        for qps in self._served.values():
            held += qps
        held += list(self._mrs.values())
        if self._dev is not None:
            held += [self._dev.pd, self._dev.ctx]
        if self._served_cq is not None:
            held.append(self._served_cq)
        for obj in held:
            # A leaked reference: pyverbs' __dealloc__ (which would destroy) never runs.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        self._conns, self._served, self._mrs, self._locks = {}, {}, {}, {}
        self._dev, self._served_cq = None, None
        self._pid = os.getpid()


def _peer_key(peer: Peer) -> tuple[str, str, int]:
    return (peer.boot_id, peer.pid_namespace, peer.pid)


def _close_ref(ref: weakref.ref[IbverbsBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend.close()


def _forget_ref(ref: weakref.ref[IbverbsBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend._forget_after_fork()
