"""The public API is curated: this list changes only on purpose."""

from __future__ import annotations

import otpmesh

EXPECTED = {
    "Actor",
    "ActorContext",
    "ActorDiedError",
    "ActorError",
    "ActorMesh",
    "ActorRef",
    "CallTimeoutError",
    "EncodeError",
    "Endpoint",
    "MeshError",
    "OtpmeshError",
    "ProcMesh",
    "ProtocolError",
    "SpawnError",
    "ValueMesh",
    "context",
    "endpoint",
    "proc_mesh",
    "run",
}


def test_public_names_are_pinned() -> None:
    public = {name for name in vars(otpmesh) if not name.startswith("_")}
    assert public - {"bench"} >= EXPECTED
    extra = public - EXPECTED - {"bench"}
    assert not extra, f"new public names need a decision (and a docs entry): {sorted(extra)}"
