"""What a node's tensor channel keeps of each buffer it owns (``Registered``), and what it holds
now in all (``RegistryStatistics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._backend import Region
from ._snapshot import Snapshot


@dataclass
class Registered:
    """One buffer a node owns: its memory, token, grant, pins, and what readers may still do."""

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
