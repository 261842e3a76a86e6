"""A ``SupervisionMachine`` subclass's settings, checked when a machine is created (before its
app starts), each error saying what to write instead: the tree, the placement, ``owned``, the
faults (the hangs need real processes, a wedge a progress deadline) and ``call_endpoint``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core._actor import Actor
from .._core._spec import ChildSpec, Mesh, Supervisor, Worker
from .._runtime._proc import HEARTBEAT_TIMEOUT
from ._faults import FAULTS, HANG_FAULTS
from ._trees import check_owned, owned_walk


def check_machine(cls: Any) -> None:
    """`cls` (a SupervisionMachine subclass) can run: raise TypeError/ValueError if not."""
    name, tree = cls.__name__, getattr(cls, "tree", None)
    if not isinstance(tree, Supervisor | Mesh):
        raise TypeError(
            f"{name}.tree must be a Supervisor or Mesh spec, not {tree!r}: write "
            "'tree = Supervisor(\"app\", children=[...])' in the class body"
        )
    if cls.placement not in ("local", "procs"):
        raise ValueError(f"{name}.placement must be 'local' or 'procs', not {cls.placement!r}")
    check_owned(tree, cls.owned)
    specs = owned_walk(tree, cls.owned)
    for path, spec in specs:
        actor = spec.actor if isinstance(spec, Worker) else None
        if not (isinstance(actor, type) and issubclass(actor, Actor)):
            continue  # an import path: the controller need not import it, nor can we check
        if cls.call_endpoint not in actor.endpoints():
            raise ValueError(
                f"{name}.call_endpoint={cls.call_endpoint!r}, but the actor of "
                f"{path} ({actor.__name__}) has no such endpoint; name one of "
                f"{sorted(actor.endpoints())} that takes no arguments"
            )
    check_faults(name, cls.faults, cls.placement, specs, cls.call_endpoint)
    check_call_timeout(cls, specs)


def check_faults(
    name: str,
    faults: Sequence[str],
    placement: str,
    specs: Sequence[tuple[str, ChildSpec]],
    call_endpoint: str,
) -> None:
    """`faults` are known, and the placement and every worker in `specs` allow them."""
    known = FAULTS + HANG_FAULTS
    unknown = set(faults) - set(known)
    if unknown or not faults:
        raise ValueError(f"{name}.faults={list(faults)!r}: use a non-empty subset of {known}")
    stuck = [fault for fault in faults if fault in HANG_FAULTS]
    if stuck and placement != "procs":
        raise ValueError(
            f"{name}.faults has {stuck}, which need real worker processes: in-process "
            "(placement='local') a wedged endpoint blocks the controller's own thread, MockClock "
            "and supervisors with it, so no deadline can end it, and there is no process to "
            f"SIGSTOP. Write placement = 'procs' in {name}, or leave them out"
        )
    if "wedge" in faults:
        lacking = [
            path
            for path, spec in specs
            if isinstance(spec, Worker) and deadline_of(spec, call_endpoint) is None
        ]
        if lacking:
            raise ValueError(
                f"{name}.faults has 'wedge', but {lacking} have no progress_deadline: only a "
                "deadline ends a wedged endpoint. Give their specs one (Worker(..., "
                f"progress_deadline=0.5)), or the {call_endpoint!r} endpoint "
                "(@otpmesh.endpoint(progress_deadline=0.5))"
            )


def check_call_timeout(cls: Any, specs: Sequence[tuple[str, ChildSpec]]) -> None:
    """A call that meets a hang ends only when the hang has ended the actor (its progress
    deadline, or the heartbeat): ``call_timeout`` must leave room for that, or the call is lost."""
    waits = {}
    if "wedge" in cls.faults:
        deadlines = [deadline_of(s, cls.call_endpoint) for _, s in specs if isinstance(s, Worker)]
        waits["wedge"] = ("the progress deadline", max(d for d in deadlines if d is not None))
    if "hang" in cls.faults:
        heartbeat = cls.heartbeat_timeout or HEARTBEAT_TIMEOUT
        waits["hang"] = ("heartbeat_timeout", heartbeat)
    for fault, (what, seconds) in waits.items():
        if cls.call_timeout < 2 * seconds:
            raise ValueError(
                f"{cls.__name__}.call_timeout={cls.call_timeout:g} s is too short for {fault!r}: "
                f"a call that meets it ends only when {what} ({seconds:g} s) has ended the "
                f"actor. Make it at least {2 * seconds:g} s, or shorten {what}"
            )


def deadline_of(spec: Worker, endpoint: str) -> float | None:
    """The progress deadline a call to `endpoint` of `spec`'s actor runs under, if it has one
    (the endpoint's own, else the spec's; an actor named by import path: the spec's)."""
    actor = spec.actor
    if isinstance(actor, type) and issubclass(actor, Actor):
        info = actor.endpoints().get(endpoint)
        if info is not None and info.progress_deadline is not None:
            return info.progress_deadline
    return spec.progress_deadline
