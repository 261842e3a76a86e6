"""A process-group member's side: joining the group of one epoch, and ``otpmesh.group()``.

A member *process* belongs to one epoch of its group for life: the controller forks every member
of an epoch at once, each joins with the ticket it was given (``GroupJoin``), and only then are
the mesh's actors started in them. When the group breaks or stops, its processes are killed and
the next epoch gets fresh ones, so no torch.distributed state (a default group, an NCCL
communicator in error, gloo pairs to dead peers) ever outlives its epoch.

The group is the process's default ``torch.distributed`` group: ``dist.all_reduce(t)``, DDP and
FSDP work unchanged inside the actor. torch is imported only here, when a member joins.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

import trio

from .._core._actor import Actor
from .._core._errors import GroupError, StaleEpochError
from .._core._exits import Ignore

#: The key the controller's store of epoch n holds n under; a ticket for another epoch is refused.
EPOCH_KEY = "otpmesh/epoch"

_SIOCGIFADDR = 0x8915


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """The process group of the running actor: backend, epoch, rank and size.

    The group itself is the process's default ``torch.distributed`` group.
    """

    backend: str
    epoch: int
    rank: int
    size: int
    store: str  # "HOST:PORT" of this epoch's rendezvous store


_lock = threading.Lock()
_membership: GroupInfo | None = None


def group() -> GroupInfo:
    """The process group of the running actor (a member of a ``Mesh(process_group=...)``)."""
    if _membership is None:
        raise RuntimeError(
            "otpmesh.group() is only available inside an actor of a Mesh with "
            "process_group='gloo' or 'nccl' (this process is not a member of a process group)"
        )
    return _membership


def prefix(ticket: dict[str, Any]) -> str:
    """Where an epoch's keys live in its store: only its members know the nonce."""
    return f"otpmesh/{ticket['epoch']}/{ticket['nonce']}/"


def connect(ticket: dict[str, Any]) -> Any:
    """A client of the ticket's store, fenced: the store must be the ticket's epoch's.

    Raises torch's DistNetworkError when no store answers (the epoch's store is closed once
    the next epoch opens), and StaleEpochError when the store is another epoch's.
    """
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    host, _, port = ticket["store"].rpartition(":")
    client = TCPStore(
        host,
        int(port),
        None,
        False,
        datetime.timedelta(seconds=ticket["connect_timeout"]),
        wait_for_workers=False,
    )
    found = client.get(EPOCH_KEY).decode() if client.check([EPOCH_KEY]) else "none"
    if found != str(ticket["epoch"]):
        raise StaleEpochError(ticket["group"], ticket["epoch"], found)
    client.set_timeout(datetime.timedelta(seconds=ticket["timeout"]))
    return PrefixStore(prefix(ticket), client)


def join(ticket: dict[str, Any]) -> GroupInfo:
    """Join the group of the ticket's epoch as this process's default group (blocking: it
    returns once every member has joined)."""
    global _membership
    import torch.distributed as dist

    with _lock:
        if _membership is not None:
            raise GroupError(
                f"this process is already rank {_membership.rank} of epoch {_membership.epoch} "
                f"of its group; a member process belongs to one epoch"
            )
        store = connect(ticket)
        _bind_to(ticket["self_host"], ticket["backend"])
        if ticket["backend"] == "nccl":
            import torch

            torch.cuda.set_device(0)  # the slot's one GPU (CUDA_VISIBLE_DEVICES)
        dist.init_process_group(
            ticket["backend"],
            store=store,
            rank=ticket["rank"],
            world_size=ticket["size"],
            timeout=datetime.timedelta(seconds=ticket["timeout"]),
        )
        _membership = GroupInfo(
            ticket["backend"], ticket["epoch"], ticket["rank"], ticket["size"], ticket["store"]
        )
        return _membership


def _bind_to(host: str, backend: str) -> None:
    """Make gloo (or NCCL's bootstrap) use the interface this worker is reached at: resolving
    the hostname finds the wrong one inside a network namespace, or none."""
    variable = "GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"
    if variable in os.environ:
        return  # the user chose
    name = _interface_of(host)
    if name is not None:
        os.environ[variable] = name


def _interface_of(host: str) -> str | None:
    try:
        address = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue  # no IPv4 address on it
            if raw[20:24] == address:
                return name
    return None


class GroupJoin(Actor):
    """The controller's way into a fresh member process: its start joins the group.

    Spawning an actor is the one operation a controller may run in a worker, so joining is the
    start of this actor, which then returns OTP's ``ignore``: nothing stays behind. A join that
    fails is a start failure the controller sees with its reason.
    """

    def __init__(self, ticket: dict[str, Any]) -> None:
        self._ticket = ticket

    async def on_start(self) -> None:
        await trio.to_thread.run_sync(join, self._ticket)
        raise Ignore
