"""The interface every tensor-channel backend implements (shm, tcp, ibverbs, cuda_ipc).

A registered buffer is a contiguous region of the owner's memory (``Region``: address, size).
Each backend, in the owner, turns it into one entry (plain msgpack data) that a reader receives
only in the owner's answer to a pin that presented the buffer's token (``_handle.Grant``), never
in the handle itself; in the reader, it moves bytes between that remote region and a local one
using its entry. Backends that need the owner's help (setting up a queue pair, serving a TCP
stream) talk to the owner's backend through ``Peer.request``, which runs the owner's
``Backend.serve`` (for token holders only) and returns its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class Region:
    """Contiguous memory in this process: its address and size in bytes."""

    address: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Peer:
    """The owner of a remote buffer, as seen by a reader: where it is, how to ask it things."""

    pid: int
    boot_id: str
    pid_namespace: str
    request: Callable[[str, str, Any], Awaitable[Any]]  # (backend name, op, payload) -> answer


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks the owner's backend (``Backend.serve``), as the owner knows it: the pid the
    kernel names for the connection (``SO_PEERCRED``; None over TCP), the buffer's memory,
    whether the buffer takes writes, and whether that connection holds a pin on it."""

    pid: int | None
    region: Region
    writable: bool
    pinned: bool


class Backend(Protocol):
    name: ClassVar[str]

    def unavailable(self) -> str | None:
        """None when this process can use the backend, else why not (said once, in the log)."""

    def register(self, buffer_id: int, region: Region, *, writable: bool) -> dict[str, Any]:
        """In the owner: make `region` reachable (for reads only, unless `writable`); return this
        backend's entry (sent to token holders only, in the answer to a pin)."""

    def unregister(self, buffer_id: int) -> None:
        """In the owner: forget the buffer (drop)."""

    def reaches(self, entry: dict[str, Any], peer: Peer) -> bool:
        """In a reader: can this process use `entry` to reach `peer` (same host, device, ...)?"""

    async def read(self, entry: dict[str, Any], peer: Peer, dst: Region, offset: int) -> None:
        """In a reader: copy dst.nbytes bytes at `offset` of the remote buffer into `dst`."""

    async def write(self, entry: dict[str, Any], peer: Peer, src: Region, offset: int) -> None:
        """In a reader: copy `src` into the remote buffer at `offset`."""

    async def serve(self, op: str, payload: Any, caller: Caller) -> Any:
        """In the owner: answer a reader's request (``Peer.request``) from `caller`."""
