"""The public API is curated: this list changes only on purpose."""

from __future__ import annotations

import otpmesh

EXPECTED = {
    # actors and meshes
    "Actor", "ActorContext", "ActorMesh", "ActorRef", "Endpoint", "Future", "ProcMesh", "Reduction",
    "ValueMesh",
    "context", "endpoint", "proc_mesh", "run", "retry", "progress", "UNANSWERED", "gather",
    # supervision
    "App", "Mesh", "Supervisor", "Worker", "start", "EventLog", "LogEntry", "LogKind", "Outcome",
    "ChildInfo", "ChildStatus", "Stacks", "start_background", "BackgroundApp", "Heal",
    "ONE_FOR_ONE", "ONE_FOR_ALL", "ALL_FOR_ONE", "REST_FOR_ONE", "ESCALATE",
    "PERMANENT", "TRANSIENT", "TEMPORARY", "BRUTAL_KILL", "INFINITY",
    "NEVER", "ANY_SIGNIFICANT", "ALL_SIGNIFICANT",
    # exits
    "ActorCrash", "ProcessExit", "Hung", "Ignore", "describe",
    # errors
    "OtpmeshError", "ActorError", "ActorDiedError", "CallTimeoutError", "ChildError",
    "DeadlockError", "EncodeError", "MeshError", "ProtocolError", "SpawnError", "SpecError",
    "SupervisorError", "AppStoppedError", "PortClosedError", "PortOverflowError",
    # ports and channels
    "Channel", "Port", "PortReceiver",
    # actors that own meshes
    "ProcMeshRef", "Subtree", "MeshFailure", "lookup", "singleton", "SingletonError",
    # hosts past this one
    "Cluster", "cluster",
    # meshes that are process groups
    "GroupInfo", "group", "GroupError", "StaleEpochError",
    # a standby controller takes the tree over
    "Takeover", "Resumption", "TakeoverError", "FencedError", "StandbyDoneError", "TakeoverHosts",
}  # fmt: skip

# Submodules users import by name; they appear as attributes once imported.
SUBMODULES = {
    "bench", "monarch",
    "testing", "chaos", "rdma",
    "launchers",
}  # fmt: skip


def test_public_names_are_pinned() -> None:
    # isidentifier: pytest rewrites the asserts of a package that ships a pytest plugin (otpmesh
    # does), which adds '@py_builtins' and '@pytest_ar' to its modules.
    public = {n for n in vars(otpmesh) if n.isidentifier() and not n.startswith("_")} - SUBMODULES
    assert public == EXPECTED, (
        f"missing: {sorted(EXPECTED - public)}; new (need a decision and a docs entry): "
        f"{sorted(public - EXPECTED)}"
    )


def test_every_error_says_when_it_is_raised() -> None:
    for name in EXPECTED:
        obj = getattr(otpmesh, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not otpmesh.OtpmeshError:
            assert obj.__doc__ and obj.__doc__.startswith("Raise"), name
