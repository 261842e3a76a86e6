"""Why a tree's root gave up, read from its event log: pure, shared by the trio driver (the
``SupervisorError`` an app raises, or an owner crashes with) and the reference model.

A log may hold more than one tree: an owned subtree writes to its owner's tree's log, and a
restarted owner's new subtree has the old one's root path. So every question is asked of one
tree's entries (``mine``: the supervisors that tree runs) since its root last started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ._errors import SupervisorError
from ._exits import describe
from ._supevents import LogEntry, LogKind


def root_run(entries: Iterable[LogEntry], root: str, mine: Callable[[str], bool]) -> list[LogEntry]:
    """The entries the tree's own supervisors wrote since its root (at path `root`) started."""
    own = [e for e in entries if mine(e.path)]
    starts = [
        i for i, e in enumerate(own) if e.kind is LogKind.SUPERVISOR_STARTED and e.path == root
    ]
    return own[starts[-1] :] if starts else own


def gave_up(run: list[LogEntry], root: str) -> bool:
    """Whether the root itself gave up (its intensity, or an escalation), in `run`."""
    return any(
        e.path == root and e.kind in (LogKind.RESTART_INTENSITY_REACHED, LogKind.ESCALATED)
        for e in run
    )


def give_up_error(
    run: list[LogEntry], root: str, reason: object, spec_at: Callable[[str], object]
) -> SupervisorError:
    """The error that says why the root at `root` exited with `reason`: which supervisor, its
    limits (`spec_at(path)`: the spec there), and the last exits that caused it."""
    reached = [e for e in run if e.kind is LogKind.RESTART_INTENSITY_REACHED]
    # The last supervisor to reach its intensity is the one whose giving up stopped the root
    # (a nested one that gave up first was a restart of its parent's, which then reached its
    # own); its children's exits are what caused it.
    blamed = reached[-1].path if reached else root
    exits = [
        e
        for e in run
        if e.kind in (LogKind.CHILD_EXITED, LogKind.START_FAILED) and e.path == blamed
    ]
    last = "; ".join(f"{e.child_path} {describe(e.reason)}" for e in exits[-3:])
    if reached:
        sup = spec_at(blamed)
        limit = f"{getattr(sup, 'intensity', '?')} restarts in {getattr(sup, 'period', '?')} s"
        head = f"supervisor {blamed} reached its restart intensity ({limit})"
    else:
        head = f"supervisor {root} exited: {describe(reason)}"
    return SupervisorError(head + (f"; last exits: {last}" if last else ""), reason)
