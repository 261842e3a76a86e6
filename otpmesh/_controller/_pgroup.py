"""Meshes that are process groups: a ``torch.distributed`` group across a Mesh's actors, formed
afresh under a new epoch at every (re)start of the group (docs/process-groups.md).

``GroupPlacement`` (``_pgplacement.py``) wraps the app's placement when the tree holds a
``Mesh(process_group=...)``.
For such a mesh, an *epoch* is one incarnation of its group:

1. it opens when the first member of the group starts after the last epoch broke or stopped:
   the old epoch's processes are killed (their torch.distributed state dies with them), every
   member process is forked at once, a fresh rendezvous store is opened on a fresh port, holding
   the epoch's number, and every process joins through its own ticket (store, epoch, a secret
   nonce under which the epoch's keys live, rank, size), all at the same time;
2. each member's actor is then started, in OTP's order, in a process already in the group;
3. it breaks when a member exits by itself (a crash, a SIGKILL, a lost host): the store is
   closed and every process of the epoch is killed at once, because the survivors are stuck in
   collectives that will never complete and cannot answer a polite stop from inside C. The
   supervisor (ONE_FOR_ALL) then finds them dead and restarts the group: a new epoch.

Members stopped by their supervisor (the end of the app, a parent's restart) get their
``shutdown`` as any actor does; their processes are killed when the next epoch opens.

The store is hosted here, in the controller, so nothing depends on rank 0 surviving and there
is no MASTER_ADDR/MASTER_PORT to choose: members reach it at this host's address (loopback, or
the cluster's advertised address when members run on other hosts).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

import trio

from .._core._actor import class_path
from .._core._errors import ActorDiedError, ActorError, SpawnError
from .._core._exits import ActorCrash, ProcessExit
from .._core._shape import all_coords
from .._core._spec import Mesh
from .._node._mesh import Slot
from .._runtime._controller_runtime import Runtime
from .._runtime._journal import read_journal
from .._runtime._pgmember import EPOCH_KEY, GroupJoin
from .._runtime._proc import Proc
from .._wire._addresses import tcp_address
from ._placement import Placement, SlotInfo, StartError, spawn_on

log = logging.getLogger("otpmesh.pgroup")

#: How long a member waits for its epoch's store to answer, and for the others to join.
CONNECT_TIMEOUT = 30.0
JOIN_TIMEOUT = 300.0

_LOOPBACK = "127.0.0.1"


@dataclass(slots=True)
class EpochStats:
    """When one epoch went through each step (trio's clock); None for a step not reached."""

    epoch: int
    opened: float  # its first member's start began
    old_dead: float | None = None  # the previous epoch's processes were gone
    forked: float | None = None  # every member process was up
    joined: float | None = None  # every member had joined the group
    broken: float | None = None  # a member exited by itself: the group broke


@dataclass(eq=False)
class _Epoch:
    number: int
    nonce: str
    store: Any  # the torch TCPStore server; dropped when the epoch ends (its port closes)
    address: str
    procs: dict[int, Proc]
    stats: EpochStats
    joined: dict[int, trio.Event] = field(default_factory=dict)
    failures: dict[int, object] = field(default_factory=dict)
    started: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> path, incarnation
    state: str = "running"  # "running", "stopping" (its supervisor stops it), "broken"


class ProcessGroup:
    """The controller's side of one process-group mesh: its epochs, their stores and processes."""

    def __init__(
        self,
        spec: Mesh,
        path: str,
        info: SlotInfo,
        inner: Placement,
        rt: Runtime,
        slot: Any,
        nursery: trio.Nursery,
    ) -> None:
        self.spec = spec
        self.path = path
        self._shape = dict(info.shape)
        self._inner = inner
        self._rt = rt
        self._slot = slot  # path -> Slot (the tree's)
        self._nursery = nursery
        self._count = 0
        self.epoch: _Epoch | None = None
        self.history: list[EpochStats] = []

    # ---------------------------------------------------------------- epochs

    def needs_new_epoch(self, rank: int | None) -> bool:
        """A start needs a new epoch unless the current one is forming and this rank is new."""
        epoch = self.epoch
        if epoch is None or epoch.state != "running":
            return True
        return bool(epoch.started) if rank is None else rank in epoch.started

    def _infos(self) -> tuple[list[str], list[SlotInfo]]:
        coords = all_coords(self._shape)
        paths = [f"{self.path}/{rank}" for rank in range(len(coords))]
        infos = [SlotInfo(self.path, r, c, dict(self._shape)) for r, c in enumerate(coords)]
        return paths, infos

    async def open_epoch(self) -> None:
        """Kill the last epoch's processes, fork every member afresh, open a new store, and
        have every member join it, all at once (the joins finish in the background)."""
        self._count += 1
        stats = EpochStats(self._count, trio.current_time())
        self._end(self.epoch)
        paths, infos = self._infos()
        old = [p for p in (self._inner.process(self._slot(path)) for path in paths) if p]
        for dying in old:
            self._rt.kill(dying)
        for dying in old:
            await dying.exited.wait()
        stats.old_dead = trio.current_time()
        await self._inner.prepare(paths, infos)
        procs = {
            rank: proc
            for rank, path in enumerate(paths)
            if (proc := self._inner.process(self._slot(path))) is not None
        }
        stats.forked = trio.current_time()
        host = self._store_host(procs.values())
        store = _store_on(host)
        store.set(EPOCH_KEY, str(self._count))
        epoch = _Epoch(
            self._count, secrets.token_hex(16), store, f"{host}:{store.port}", procs, stats
        )
        self.epoch = epoch
        self.history.append(stats)
        if self._rt.takeover is not None:  # the number a standby's adopted epoch goes on from
            self._rt.takeover.journal.append({"group": self.path, "epoch": self._count})
        for rank in range(len(paths)):
            epoch.joined[rank] = trio.Event()
            self._nursery.start_soon(self._join, epoch, rank, infos[rank])

    def adopt(self, procs: dict[int, Proc]) -> None:
        """Take the epoch a takeover found running as this group's current one: its members'
        processes are still in their torch.distributed group (gloo's pairs connect them
        directly; the store, gone with the old controller, serves only to form an epoch). Its
        number is the journal's, so the next epoch's is higher, as without a takeover."""
        state = self._rt.takeover
        records = read_journal(state.root) if state is not None else []
        journalled = [r for r in records if r.get("group") == self.path]
        self._count = int(journalled[-1]["epoch"]) if journalled else self._count + 1
        now = trio.current_time()
        stats = EpochStats(self._count, now, old_dead=now, forked=now, joined=now)
        self.epoch = _Epoch(self._count, "", None, "", dict(procs), stats)
        for rank in procs:
            self.epoch.joined[rank] = trio.Event()
            self.epoch.joined[rank].set()
        self.history.append(stats)
        log.info("%s: epoch %d adopted from the controller taken over", self.path, self._count)

    def _store_host(self, procs: Any) -> str:
        if any(p.host is not None for p in procs) and self._rt.cluster is not None:
            where = tcp_address(self._rt.cluster.address)
            if where is not None:
                return where[0]
        return _LOOPBACK

    def ticket(self, epoch: _Epoch, rank: int) -> dict[str, Any]:
        """What member `rank` joins with; it travels only on the authenticated worker link."""
        proc = epoch.procs.get(rank)
        own = tcp_address(proc.addr) if proc is not None else None
        return {
            "group": self.path,
            "backend": self.spec.process_group,
            "epoch": epoch.number,
            "nonce": epoch.nonce,
            "store": epoch.address,
            "rank": rank,
            "size": len(epoch.joined),
            "self_host": own[0] if own is not None else _LOOPBACK,
            "connect_timeout": CONNECT_TIMEOUT,
            "timeout": JOIN_TIMEOUT,
        }

    async def _join(self, epoch: _Epoch, rank: int, info: SlotInfo) -> None:
        proc = epoch.procs.get(rank)
        try:
            if proc is None or proc.conn is None:
                raise StartError(ProcessExit(proc.pid if proc else 0, "did not start"))
            payload = {
                "id": f"{self.path}/{rank}#join{epoch.number}",
                "incarnation": epoch.number,
                "cls": class_path(GroupJoin),
                "name": self.path,
                "rank": rank,
                "coords": info.coords,
                "shape": info.shape,
                "args": [self.ticket(epoch, rank)],
                "kwargs": {},
            }
            await spawn_on(self._rt, proc, payload)
        except ActorError as exc:
            self._fail(epoch, rank, ActorCrash(exc.type_name, exc.message, exc.traceback))
        except ActorDiedError as exc:
            self._fail(epoch, rank, ProcessExit(proc.pid if proc else 0, exc.reason))
        except StartError as exc:
            self._fail(epoch, rank, exc.reason)
        finally:
            epoch.joined[rank].set()
            if all(e.is_set() for e in epoch.joined.values()) and not epoch.failures:
                epoch.stats.joined = trio.current_time()
                log.info("%s: epoch %d formed", self.path, epoch.number)

    def _fail(self, epoch: _Epoch, rank: int, reason: object) -> None:
        epoch.failures[rank] = reason
        self.break_epoch(epoch)  # the others would wait for this member until their timeout

    async def member_ready(self, slot: Slot, rank: int) -> None:
        """Wait until member `rank` of the current epoch has joined; StartError if it cannot."""
        if self.needs_new_epoch(rank):
            try:
                await self.open_epoch()
            except SpawnError as exc:
                raise StartError(ActorCrash("SpawnError", str(exc))) from exc
        epoch = self.epoch
        if epoch is None:  # pragma: no cover - open_epoch has just set it
            raise StartError(ActorCrash("GroupError", f"{self.path} has no epoch"))
        await epoch.joined[rank].wait()
        failure = epoch.failures.get(rank)
        if failure is None and epoch.failures:
            failure = ActorCrash("GroupError", f"epoch {epoch.number} of {self.path} broke")
        if failure is None and self._inner.process(slot) is not epoch.procs.get(rank):
            failure = ProcessExit(epoch.procs[rank].pid, "left the group before its actor started")
        if failure is not None:
            self.break_epoch(epoch)
            raise StartError(failure)

    def member_started(self, rank: int, path: str, incarnation: int) -> None:
        if self.epoch is not None:
            self.epoch.started[rank] = (path, incarnation)

    def member_exited(self, path: str, incarnation: int) -> None:
        """An exit of a member while its epoch runs breaks the group (see the module doc)."""
        epoch = self.epoch
        if epoch is None or epoch.state != "running":
            return
        if (path, incarnation) in epoch.started.values():
            self.break_epoch(epoch)

    def break_epoch(self, epoch: _Epoch) -> None:
        if epoch.state == "broken":
            return
        epoch.state = "broken"
        epoch.stats.broken = trio.current_time()
        epoch.store = None  # its port closes: nobody joins a broken epoch
        for proc in epoch.procs.values():
            self._rt.kill(proc)

    def stopping(self) -> None:
        """Its supervisor stops the members: their exits now are expected, not a break."""
        if self.epoch is not None and self.epoch.state == "running":
            self.epoch.state = "stopping"

    def _end(self, epoch: _Epoch | None) -> None:
        if epoch is not None:
            if epoch.state == "running":
                epoch.state = "stopping"
            epoch.store = None

    def close(self) -> None:
        self._end(self.epoch)


def _store_on(host: str) -> Any:
    """A fresh TCPStore listening on `host` only (on its own, TCPStore listens on every
    interface, whatever host it is given): loopback for one host, the cluster's address else."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        fd = os.dup(listener.fileno())  # the store's server owns (and closes) this one
    finally:
        listener.close()
    try:
        return TCPStore(host, port, None, True, wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise
