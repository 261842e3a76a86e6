"""RC queue pairs of the ibverbs backend: made and walked to RTS, the reader's half of one
(`Conn`), and the transfer loop that posts RDMA READ/WRITE work requests and polls their
completions from trio without blocking the loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from ._backend import Region
from ._verbs import (
    Device,
    IbverbsError,
    IbverbsPeerLost,
    IbverbsRemoteAccessError,
    IbverbsTimeout,
    enums,
    pyverbs,
    wc_status_name,
)

# RC transport parameters, as in ibv_rc_pingpong: local ACK timeout 4.096 us * 2^14 = 67 ms and
# 7 retries, so a peer that vanished is reported within about half a second of silence.
ACK_TIMEOUT = 14
RETRY_CNT = 7
RNR_RETRY = 6  # 7 would mean "retry forever" on receiver-not-ready; never hang
MIN_RNR_TIMER = 12
# Outstanding work requests per queue pair (and so CQ entries per connection).
MAX_SEND_WR = 64
# How often a stalled transfer checks whether its owner (on this host) still exists.
LIVENESS_PERIOD = 0.5


@dataclass
class Conn:
    """The reader's half of one RC queue pair to one owner, with its own completion queue."""

    qp: Any
    cq: Any
    free_slots: int = MAX_SEND_WR
    # Completions drained from the CQ by any task, waiting for the task that posted them.
    done: dict[int, tuple[int, int]] = field(default_factory=dict)
    dead: str | None = None  # why it was torn down; set once, never cleared
    # The owner's pid and start time when it runs on this host in our pid namespace, so a
    # stalled transfer can see it died (see owner_gone); None elsewhere.
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


def create_qp(dev: Device, cq: Any, max_send_wr: int) -> Any:
    pv, e = pyverbs(), enums()
    cap = pv.qp.QPCap(max_send_wr=max_send_wr, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    init = pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0)
    return pv.qp.QP(dev.pd, init)  # RESET; to_rts walks INIT -> RTR -> RTS


def to_rts(
    dev: Device,
    qp: Any,
    remote: dict[str, Any],
    *,
    my_psn: int,
    max_rd_atomic: int,
    max_dest_rd_atomic: int,
    remote_access: bool,
) -> None:
    pv, e = pyverbs(), enums()
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
    attr.min_rnr_timer = MIN_RNR_TIMER
    attr.timeout = ACK_TIMEOUT
    attr.retry_cnt = RETRY_CNT
    attr.rnr_retry = RNR_RETRY
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


async def transfer(
    dev: Device,
    conn: Conn,
    op: str,
    entry: dict[str, Any],
    local: Region,
    offset: int,
    mr: Any,
    wr_ids: Iterator[int],
    deadline: float,
    limit: float,
    what: str,
    which: str,
) -> None:
    """Move `local` to or from the owner's buffer at `offset` in chunks on `conn`; raise on a
    failed completion, a dead owner, or past `deadline` (`which` names the limit: the backend's
    timeout, or its backstop)."""
    pv, e = pyverbs(), enums()
    opcode = e.IBV_WR_RDMA_READ if op == "read" else e.IBV_WR_RDMA_WRITE
    remote = int(entry["address"]) + offset
    chunks = [
        (start, min(dev.max_chunk, local.nbytes - start))
        for start in range(0, local.nbytes, dev.max_chunk)
    ]
    outstanding: set[int] = set()
    failure: tuple[int, int] | None = None
    idle = 0
    next_check = time.monotonic() + LIVENESS_PERIOD
    peer_pid = conn.owner[0] if conn.owner else None
    while chunks or outstanding:
        if conn.dead is not None:
            raise IbverbsError(f"{what}: its queue pair was torn down ({conn.dead})")
        while chunks and conn.free_slots > 0:
            start, length = chunks.pop(0)
            wr_id = next(wr_ids)
            sge = pv.wr.SGE(local.address + start, length, mr.lkey)
            wr = pv.wr.SendWR(
                wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                send_flags=e.IBV_SEND_SIGNALED,
            )  # fmt: skip
            wr.set_wr_rdma(int(entry["rkey"]), remote + start)
            conn.qp.post_send(wr)
            conn.free_slots -= 1
            outstanding.add(wr_id)
        drain(conn)
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
            raise completion_error(failure, what, entry)
        if not outstanding and not chunks:
            return
        now = time.monotonic()
        if not progressed and now >= next_check:
            next_check = now + LIVENESS_PERIOD
            if owner_gone(conn):
                raise IbverbsPeerLost(
                    f"{what}: the owner process has exited (the transfer stalled and pid "
                    f"{peer_pid} is gone)"
                )
        if now > deadline:
            raise IbverbsTimeout(
                f"{what} timed out after {limit:g} s ({local.nbytes} bytes; the ibverbs "
                f"backend's {which})"
            )
        # Spin a little (small transfers finish in microseconds on hardware), then back
        # off to at most 1 ms between polls so a long transfer does not burn the loop.
        idle = 0 if progressed else idle + 1
        await trio.sleep(0 if idle < 50 else min(1e-3, 1e-5 * 2 ** min(idle - 50, 7)))


def completion_error(status: tuple[int, int], what: str, entry: dict[str, Any]) -> IbverbsError:
    e = enums()
    code, vendor = status
    name = wc_status_name(code)
    if code in (e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_REM_INV_REQ_ERR):
        return IbverbsRemoteAccessError(
            f"{what}: the owner's device refused access ({name}): buffer "
            f"{entry['buffer']} was dropped (unregistered) or its rkey is no longer valid"
        )
    if code in (e.IBV_WC_RETRY_EXC_ERR, e.IBV_WC_RNR_RETRY_EXC_ERR):
        return IbverbsPeerLost(
            f"{what}: the owner's queue pair stopped answering ({name} after "
            f"{RETRY_CNT} retries): the owner process is probably dead or unreachable"
        )
    return IbverbsError(f"{what}: work completion {name} (vendor error {vendor:#x})")


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def owner_gone(conn: Conn) -> bool:
    """True when the owner (on this host) has exited. Needed because soft-RoCE (rxe, Linux 6.1)
    never completes a work request whose responder QP was destroyed with a retry error: it
    stalls; on hardware the RC retry limit reports it, for owners on other hosts too."""
    if conn.owner is None:
        return False
    pid, started = conn.owner
    return start_time(pid) != started


def drain(conn: Conn) -> None:
    """Move every available completion of the connection's CQ into `conn.done`."""
    while True:
        n, wcs = conn.cq.poll(16)
        for wc in wcs:
            conn.done[int(wc.wr_id)] = (int(wc.status), int(wc.vendor_err))
        if n < 16:
            return
