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

pyverbs: Debian/Ubuntu's ``python3-pyverbs`` (built with rdma-core, for the system Python) is the
supported install. Another CPython of the same minor version can use it by putting *only* the
``pyverbs`` package on its path (a directory holding a symlink to
``/usr/lib/python3/dist-packages/pyverbs``); see ``tests/rdma/run_softroce.sh``. The PyPI
``pyverbs`` sdist needs rdma-core's build tree and does not build on its own.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

import trio

from .._node._hostid import boot_id, pid_namespace
from ._backend import Caller, Peer, Region

# Settings, all optional: which device/port/GID index this process uses.
_ENV_DEVICE = "OTPMESH_IBVERBS_DEVICE"
_ENV_PORT = "OTPMESH_IBVERBS_PORT"
_ENV_GID_INDEX = "OTPMESH_IBVERBS_GID_INDEX"

# RC transport parameters, as in ibv_rc_pingpong: local ACK timeout 4.096 us * 2^14 = 67 ms and
# 7 retries, so a peer that vanished is reported within about half a second of silence.
_ACK_TIMEOUT = 14
_RETRY_CNT = 7
_RNR_RETRY = 6  # 7 would mean "retry forever" on receiver-not-ready; never hang
_MIN_RNR_TIMER = 12
# Outstanding work requests per queue pair (and so CQ entries per connection).
_MAX_SEND_WR = 64
# Outstanding RDMA READs per QP; clipped to the device's limits and the peer's.
_RD_ATOMIC = 16
# The deadline when no timeout is set: _BACKSTOP_S plus the size at _BACKSTOP_RATE bytes/s.
_BACKSTOP_S = 30.0
_BACKSTOP_RATE = 10e6
# How often a stalled transfer checks whether its owner (on this host) still exists.
_LIVENESS_PERIOD = 0.5
# One work request moves at most this much (RC messages may be up to 2 GiB; stay well below).
_MAX_CHUNK = 1 << 30

_PYVERBS_MISSING = (
    "pyverbs is not installed: apt-get install python3-pyverbs, then make it visible to this "
    "Python (a directory with a symlink to /usr/lib/python3/dist-packages/pyverbs on PYTHONPATH, "
    "or a venv made with --system-site-packages from /usr/bin/python3; see docs/rdma.md)"
)


class IbverbsError(RuntimeError):
    """A transfer over ibverbs failed; the queue pair was torn down (the next one reconnects)."""


class IbverbsRemoteAccessError(IbverbsError):
    """The owner's device refused the access: the buffer was dropped (unregistered)."""


class IbverbsPeerLost(IbverbsError):
    """The owner's queue pair stopped answering: the owner process is most likely dead."""


class IbverbsTimeout(IbverbsError, TimeoutError):
    """The transfer did not complete before the backend's own deadline."""


def _pyverbs() -> Any:
    """Import pyverbs lazily (it is optional and absent on most machines); return the package."""
    import pyverbs.addr
    import pyverbs.cq
    import pyverbs.device
    import pyverbs.mr
    import pyverbs.pd
    import pyverbs.pyverbs_error
    import pyverbs.qp
    import pyverbs.wr

    return pyverbs


def _enums() -> Any:
    # rdma-core < 50 names the module pyverbs.enums, later versions pyverbs.libibverbs_enums.
    try:
        import pyverbs.enums as enums
    except ImportError:
        import pyverbs.libibverbs_enums as enums
    return enums


def _wc_status_name(status: int) -> str:
    # Completion statuses are the IBV_WC_*_ERR names (opcodes share the IBV_WC_ prefix).
    e = _enums()
    for name in dir(e):
        if name.startswith("IBV_WC_") and name.endswith("_ERR") and getattr(e, name) == status:
            return name
    return f"status {status}"


@dataclass
class _Device:
    """This process's open device: context, protection domain, port and address."""

    ctx: Any
    pd: Any
    name: str
    port: int
    gid_index: int
    gid: str
    lid: int
    ethernet: bool
    roce_v2: bool
    mtu: int
    max_chunk: int
    max_rd_atomic: int  # as initiator (device max_qp_init_rd_atom)
    max_dest_rd_atomic: int  # as responder (device max_qp_rd_atom)


@dataclass
class _Conn:
    """The reader's half of one RC queue pair to one owner, with its own completion queue."""

    qp: Any
    cq: Any
    free_slots: int = _MAX_SEND_WR
    # Completions drained from the CQ by any task, waiting for the task that posted them.
    done: dict[int, tuple[int, int]] = field(default_factory=dict)
    dead: str | None = None  # why it was torn down; set once, never cleared
    # The owner's pid and start time when it runs on this host in our pid namespace, so a
    # stalled transfer can see it died (see _owner_gone); None elsewhere.
    owner: tuple[int, str] | None = None

    def teardown(self, why: str) -> None:
        """Destroy the QP (the device stops all its DMA) and the CQ; other waiters see `dead`."""
        if self.dead is None:
            self.dead = why
            for obj in (self.qp, self.cq):
                try:
                    obj.close()
                except Exception:  # already in error; nothing more to undo
                    pass


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
        self._dev: _Device | None = None
        self._pid = os.getpid()
        # owner side
        self._mrs: dict[int, Any] = {}
        self._served_cq: Any = None
        self._served: dict[tuple[str, str, int], list[Any]] = {}
        self.connects_served = 0  # for tests and diagnostics: QPs set up on request
        # reader side
        self._conns: dict[tuple[str, str, int], _Conn] = {}
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
        try:
            pv = _pyverbs()
            e = _enums()
        except ImportError:
            return _PYVERBS_MISSING
        try:
            devices = pv.device.get_device_list()
        except pv.pyverbs_error.PyverbsError as exc:
            # libibverbs fails this way when the kernel has no RDMA support at all.
            hint = "" if os.path.isdir("/sys/class/infiniband") else "; no /sys/class/infiniband"
            return f"no RDMA device (ibv_get_device_list failed: {exc}{hint})"
        if not devices:
            return "no RDMA device (ibv_get_device_list is empty)"
        names = [d.name.decode() for d in devices]
        wanted = os.environ.get(_ENV_DEVICE)
        port = int(os.environ.get(_ENV_PORT, "1"))
        if wanted and wanted not in names:
            return f"RDMA device {wanted!r} ({_ENV_DEVICE}) not found; devices: {names}"
        reasons = []
        for name in [wanted] if wanted else names:
            # Open and close again: nothing verbs-related stays open until the first real use,
            # so a process that only asked does not carry a device context across fork().
            try:
                with pv.device.Context(name=name) as ctx:
                    state = ctx.query_port(port).state
            except pv.pyverbs_error.PyverbsError as exc:
                reasons.append(f"{name}: {exc}")
                continue
            if state == e.IBV_PORT_ACTIVE:
                self._device_name = name
                return None
            reasons.append(f"{name} port {port} is not active (state {state})")
        return "no usable RDMA device: " + "; ".join(reasons)

    def _device(self) -> _Device:
        if self._dev is not None:
            return self._dev
        why = self.unavailable()
        if why is not None:
            raise IbverbsError(f"ibverbs is unavailable here: {why}")
        pv, e = _pyverbs(), _enums()
        name = self._device_name
        port = int(os.environ.get(_ENV_PORT, "1"))
        ctx = pv.device.Context(name=name)
        try:
            port_attr = ctx.query_port(port)
            dev_attr = ctx.query_device()
            ethernet = port_attr.link_layer == e.IBV_LINK_LAYER_ETHERNET
            gid_index, gid, roce_v2 = self._pick_gid(ctx, port, port_attr.gid_tbl_len, ethernet)
            self._dev = _Device(
                ctx=ctx,
                pd=pv.pd.PD(ctx),
                name=name,
                port=port,
                gid_index=gid_index,
                gid=gid,
                lid=int(port_attr.lid),
                ethernet=ethernet,
                roce_v2=roce_v2,
                mtu=int(port_attr.active_mtu),
                max_chunk=min(int(port_attr.max_msg_sz) or _MAX_CHUNK, _MAX_CHUNK),
                max_rd_atomic=max(1, min(_RD_ATOMIC, int(dev_attr.max_qp_init_rd_atom))),
                max_dest_rd_atomic=max(1, min(_RD_ATOMIC, int(dev_attr.max_qp_rd_atom))),
            )
        except BaseException:
            ctx.close()
            raise
        return self._dev

    @staticmethod
    def _pick_gid(ctx: Any, port: int, table_len: int, ethernet: bool) -> tuple[int, str, bool]:
        """Choose the source GID: the setting, else on Ethernet (RoCE) an IPv4-mapped RoCEv2 GID
        (routable, what rxe and most RoCE fabrics use), else the first non-zero one."""
        e = _enums()
        configured = os.environ.get(_ENV_GID_INDEX)
        candidates = [int(configured)] if configured else list(range(table_len))
        found: list[tuple[int, str, bool]] = []
        for index in candidates:
            try:
                gid = str(ctx.query_gid(port, index))
            except Exception:
                continue
            if gid.replace(":", "").strip("0") == "":
                continue  # an empty slot of the table
            v2 = False
            if ethernet:
                try:
                    v2 = ctx.query_gid_type(port, index) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
                except Exception:
                    v2 = False
            found.append((index, gid, v2))
        if not found:
            raise IbverbsError(f"no usable GID on port {port} (table of {table_len})")
        if ethernet and not configured:
            found.sort(
                key=lambda f: (not f[2], not f[1].startswith("0000:0000:0000:0000:0000:ffff"))
            )
        return found[0]

    # ---- owner side ---------------------------------------------------------------------------

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        dev = self._device()
        if buffer_id in self._mrs:
            raise IbverbsError(f"buffer {buffer_id} is already registered")
        rkey = 0
        if region.nbytes > 0:  # a zero-length MR is invalid; nothing to reach anyway
            pv, e = _pyverbs(), _enums()
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
        pv = _pyverbs()
        reader = (str(payload["reader"][0]), str(payload["reader"][1]), int(payload["reader"][2]))
        self._forget_dead_readers()
        # A reader reconnects only after its previous QP failed: that one is useless now.
        for old in self._served.pop(reader, []):
            _close_quietly(old)
        if self._served_cq is None:
            # Responder-side RDMA READ/WRITE produce no completions; the QP still needs a CQ.
            self._served_cq = pv.cq.CQ(dev.ctx, 1, None, None, 0)
        qp = self._create_qp(dev, self._served_cq, max_send_wr=1)
        psn = random.getrandbits(24)
        try:
            self._to_rts(
                dev,
                qp,
                payload,
                my_psn=psn,
                max_rd_atomic=1,
                max_dest_rd_atomic=dev.max_dest_rd_atomic,
                remote_access=True,
            )
        except BaseException:
            _close_quietly(qp)
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
                    _close_quietly(qp)
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
            await self._run(dev, conn, op, entry, local, offset, mr, deadline, limit, what)
        except BaseException as exc:
            # Error, timeout or cancellation with work possibly in flight: destroying the QP
            # stops the device from touching `local` before its MR goes away below.
            conn.teardown(f"{what} failed: {exc!r}")
            if self._conns.get(_peer_key(peer)) is conn:
                del self._conns[_peer_key(peer)]
            raise
        finally:
            mr.close()

    def _local_mr(self, dev: _Device, local: Region, writable: bool) -> Any:
        """Register the reader's region for this transfer only. A cache keyed by address would
        be wrong without memory hooks: freed and reused memory keeps the old pinned pages, and
        the device would then write where nobody looks (silent corruption)."""
        pv, e = _pyverbs(), _enums()
        # Reading a remote buffer writes local memory; writing one only reads it (so read-only
        # memory can be a source).
        access = e.IBV_ACCESS_LOCAL_WRITE if writable else 0
        return pv.mr.MR(dev.pd, local.nbytes, access, address=local.address)

    async def _run(
        self,
        dev: _Device,
        conn: _Conn,
        op: str,
        entry: dict[str, Any],
        local: Region,
        offset: int,
        mr: Any,
        deadline: float,
        limit: float,
        what: str,
    ) -> None:
        pv, e = _pyverbs(), _enums()
        opcode = e.IBV_WR_RDMA_READ if op == "read" else e.IBV_WR_RDMA_WRITE
        remote = int(entry["address"]) + offset
        chunks = [
            (start, min(dev.max_chunk, local.nbytes - start))
            for start in range(0, local.nbytes, dev.max_chunk)
        ]
        outstanding: set[int] = set()
        failure: tuple[int, int] | None = None
        idle = 0
        next_check = time.monotonic() + _LIVENESS_PERIOD
        peer_pid = conn.owner[0] if conn.owner else None
        while chunks or outstanding:
            if conn.dead is not None:
                raise IbverbsError(f"{what}: its queue pair was torn down ({conn.dead})")
            while chunks and conn.free_slots > 0:
                start, length = chunks.pop(0)
                wr_id = next(self._wr_ids)
                sge = pv.wr.SGE(local.address + start, length, mr.lkey)
                wr = pv.wr.SendWR(
                    wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED,
                )  # fmt: skip
                wr.set_wr_rdma(int(entry["rkey"]), remote + start)
                conn.qp.post_send(wr)
                conn.free_slots -= 1
                outstanding.add(wr_id)
            _drain(conn)
            progressed = False
            for wr_id in [w for w in outstanding if w in conn.done]:
                status = conn.done.pop(wr_id)
                outstanding.discard(wr_id)
                conn.free_slots += 1
                progressed = True
                if status[0] != e.IBV_WC_SUCCESS and (
                    failure is None or failure[0] == e.IBV_WC_WR_FLUSH_ERR
                ):
                    failure = status  # the first real error, not the flushes it causes
            if failure is not None:
                raise self._completion_error(failure, what, entry)
            if not outstanding and not chunks:
                return
            now = time.monotonic()
            if not progressed and now >= next_check:
                next_check = now + _LIVENESS_PERIOD
                if _owner_gone(conn):
                    raise IbverbsPeerLost(
                        f"{what}: the owner process has exited (the transfer stalled and pid "
                        f"{peer_pid} is gone)"
                    )
            if now > deadline:
                raise IbverbsTimeout(
                    f"{what} timed out after {limit:g} s ({local.nbytes} bytes; the ibverbs "
                    f"backend's {'timeout' if self.timeout is not None else 'backstop'})"
                )
            # Spin a little (small transfers finish in microseconds on hardware), then back
            # off to at most 1 ms between polls so a long transfer does not burn the loop.
            idle = 0 if progressed else idle + 1
            await trio.sleep(0 if idle < 50 else min(1e-3, 1e-5 * 2 ** min(idle - 50, 7)))

    @staticmethod
    def _completion_error(
        status: tuple[int, int], what: str, entry: dict[str, Any]
    ) -> IbverbsError:
        e = _enums()
        code, vendor = status
        name = _wc_status_name(code)
        if code in (e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_REM_INV_REQ_ERR):
            return IbverbsRemoteAccessError(
                f"{what}: the owner's device refused access ({name}): buffer "
                f"{entry['buffer']} was dropped (unregistered) or its rkey is no longer valid"
            )
        if code in (e.IBV_WC_RETRY_EXC_ERR, e.IBV_WC_RNR_RETRY_EXC_ERR):
            return IbverbsPeerLost(
                f"{what}: the owner's queue pair stopped answering ({name} after "
                f"{_RETRY_CNT} retries): the owner process is probably dead or unreachable"
            )
        return IbverbsError(f"{what}: work completion {name} (vendor error {vendor:#x})")

    async def _connection(self, dev: _Device, entry: dict[str, Any], peer: Peer) -> _Conn:
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
            pv = _pyverbs()
            cq = pv.cq.CQ(dev.ctx, _MAX_SEND_WR + 1, None, None, 0)
            try:
                qp = self._create_qp(dev, cq, max_send_wr=_MAX_SEND_WR)
            except BaseException:
                _close_quietly(cq)
                raise
            conn = _Conn(qp=qp, cq=cq)
            if peer.boot_id == boot_id() and peer.pid_namespace == pid_namespace():
                started = _start_time(peer.pid)
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
                self._to_rts(
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

    @staticmethod
    def _create_qp(dev: _Device, cq: Any, max_send_wr: int) -> Any:
        pv, e = _pyverbs(), _enums()
        cap = pv.qp.QPCap(max_send_wr=max_send_wr, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0)
        return pv.qp.QP(dev.pd, init)  # RESET; to_rts walks INIT -> RTR -> RTS

    @staticmethod
    def _to_rts(
        dev: _Device,
        qp: Any,
        remote: dict[str, Any],
        *,
        my_psn: int,
        max_rd_atomic: int,
        max_dest_rd_atomic: int,
        remote_access: bool,
    ) -> None:
        pv, e = _pyverbs(), _enums()
        attr = pv.qp.QPAttr(port_num=dev.port)
        # Only the owner's half accepts one-sided access; the reader's refuses everything.
        attr.qp_access_flags = (
            e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
            if remote_access
            else e.IBV_ACCESS_LOCAL_WRITE
        )
        attr.pkey_index = 0
        attr.path_mtu = min(dev.mtu, int(remote["mtu"]))
        attr.dest_qp_num = int(remote["qpn"])
        attr.rq_psn = int(remote["psn"])  # we expect the peer's packets to start at its PSN
        attr.sq_psn = my_psn
        attr.max_rd_atomic = max_rd_atomic
        attr.max_dest_rd_atomic = max_dest_rd_atomic
        attr.min_rnr_timer = _MIN_RNR_TIMER
        attr.timeout = _ACK_TIMEOUT
        attr.retry_cnt = _RETRY_CNT
        attr.rnr_retry = _RNR_RETRY
        if dev.ethernet:
            # RoCE has no LIDs: every packet carries a GRH addressed by GID. hop_limit > 1 so
            # RoCEv2 crosses IP routers.
            gr = pv.addr.GlobalRoute(
                dgid=pv.addr.GID(str(remote["gid"])), sgid_index=dev.gid_index, hop_limit=64
            )
            attr.ah_attr = pv.addr.AHAttr(port_num=dev.port, is_global=1, gr=gr)
        else:
            attr.ah_attr = pv.addr.AHAttr(port_num=dev.port, dlid=int(remote["lid"]))
        qp.to_rts(attr)

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
                _close_quietly(qp)
        self._served.clear()
        for mr in self._mrs.values():
            _close_quietly(mr)
        self._mrs.clear()
        dev, self._dev = self._dev, None
        for obj in (self._served_cq, dev.pd if dev else None, dev.ctx if dev else None):
            if obj is not None:
                _close_quietly(obj)
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


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _owner_gone(conn: _Conn) -> bool:
    """True when the owner (on this host) has exited. Needed because soft-RoCE (rxe, Linux 6.1)
    never completes a work request whose responder QP was destroyed with a retry error: it
    stalls; on hardware the RC retry limit reports it, for owners on other hosts too."""
    if conn.owner is None:
        return False
    pid, started = conn.owner
    return _start_time(pid) != started


def _peer_key(peer: Peer) -> tuple[str, str, int]:
    return (peer.boot_id, peer.pid_namespace, peer.pid)


def _drain(conn: _Conn) -> None:
    """Move every available completion of the connection's CQ into `conn.done`."""
    while True:
        n, wcs = conn.cq.poll(16)
        for wc in wcs:
            conn.done[int(wc.wr_id)] = (int(wc.status), int(wc.vendor_err))
        if n < 16:
            return


def _close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception:  # best effort: teardown of something already failed or gone
        pass


def _close_ref(ref: weakref.ref[IbverbsBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend.close()


def _forget_ref(ref: weakref.ref[IbverbsBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend._forget_after_fork()
