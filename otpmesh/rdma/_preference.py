"""Which tensor-channel backends this process may use (``OTPMESH_RDMA_BACKENDS``) and can use,
in preference order; and which one a transfer takes to reach an owner (a fallback from the best
said once)."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable

from .._core._sandbox import confined
from .._node._hostid import boot_id, pid_namespace
from ._backend import Backend, Peer
from ._error import RDMAError
from ._handle import Grant
from ._shm import ShmBackend
from ._tcp import TcpBackend

log = logging.getLogger("otpmesh.rdma")

#: Preference order: the first backend both ends can use wins.
PREFERENCE = ("cuda_ipc", "shm", "ibverbs", "tcp")

#: Backends that act on the pid a grant names (process_vm_readv): used only when the kernel
#: vouched for that pid.
_PID_BACKENDS = frozenset({"shm"})

# Fallbacks already said once: (best backend, backend used).
_warned: set[tuple[str, str]] = set()


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


def make_backends() -> dict[str, Backend]:
    made: dict[str, Backend] = {"shm": ShmBackend(), "tcp": TcpBackend()}
    try:  # imported by name: the ibverbs backend is optional (pyverbs, a device)
        ibverbs = importlib.import_module("otpmesh.rdma._ibverbs")
    except ImportError:
        pass
    else:
        made["ibverbs"] = ibverbs.IbverbsBackend()
    return made


def choose(
    usable: dict[str, Backend], grant: Grant, peer: Peer, verified: bool, buffer_id: int
) -> tuple[str, Backend]:
    """The first allowed backend of `usable` that reaches `peer`, the owner of `buffer_id`
    (one acting on the grant's pid only when the kernel `verified` it)."""
    allowed = allowed_backends()
    for name in allowed:
        if name in _PID_BACKENDS and not verified:
            continue
        backend = usable.get(name)
        entry = grant.entries.get(name)
        if backend is not None and entry is not None and backend.reaches(entry, peer):
            _note_fallback([n for n in allowed if n in usable], name, peer)
            return name, backend
    why = ""
    if "shm" in grant.entries and confined():
        why = (
            "; this worker is sandboxed (docs/security.md), so shm reaches no other "
            "worker: allow tcp too (OTPMESH_RDMA_BACKENDS=shm,tcp) or set OTPMESH_SANDBOX=0"
        )
    raise RDMAError(
        f"no backend reaches the owner of buffer {buffer_id}: it offers "
        f"{sorted(grant.entries)}, this process can use {sorted(usable)} "
        f"(allowed: {allowed}){why}"
    )


def _note_fallback(allowed: Iterable[str], used: str, peer: Peer) -> None:
    best = next(iter(allowed))
    if used != best and (best, used) not in _warned:
        _warned.add((best, used))
        here = (boot_id(), pid_namespace())
        if best == "shm" and confined() and (peer.boot_id, peer.pid_namespace) == here:
            # The sandbox's doing, as it is by default: said, not warned about.
            log.info(
                "tensor channel: using %s, not shm: this worker is sandboxed, so shm "
                "reaches no other worker (docs/security.md); said once",
                used,
            )
            return
        log.warning(
            "tensor channel: using %s, not %s (not usable or not reaching the owner); said once",
            used,
            best,
        )
