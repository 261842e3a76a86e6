"""A supervisor's children as others see them: ``which_children``'s rows, and what changed in
them since they were last reported (what a takeover's journal keeps: _livetree.py)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from ._spec import ChildSpec, Worker


class ChildStatus(enum.StrEnum):
    """OTP's pid field: a pid, ``undefined``, or ``{restarting, _}`` during a retry loop."""

    RUNNING = "running"
    UNDEFINED = "undefined"
    RESTARTING = "restarting"


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """One row of ``which_children``: a child's id, its status (OTP's pid field), the
    incarnation now or last started (0: never started) and its spec as written."""

    id: str
    status: ChildStatus
    incarnation: int
    spec: ChildSpec  # as written: a Mesh stays a Mesh

    @property
    def type(self) -> str:
        """OTP's child type: ``"supervisor"`` (a Supervisor, or a Mesh: a supervisor group),
        else ``"worker"``."""
        return "worker" if isinstance(self.spec, Worker) else "supervisor"


@dataclass(frozen=True, slots=True)
class ChildChanges:
    """What changed in a supervisor's child list since it was last reported: `rows` (in child
    order) are the children added or changed, `deleted` the ids no longer there. A `full`
    report is the whole list (the first report of a supervisor's life): it replaces any
    earlier one."""

    full: bool
    rows: tuple[ChildInfo, ...]
    deleted: tuple[str, ...] = ()
    #: The last incarnation given to a child, where that is past its row's (a start that
    #: never ran: ignored, failed) or it has no row (gone): the next start of that id goes on
    #: from it. For a change: those that changed, and those of the rows it holds.
    given: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Reported:
    """A child list as last reported: each child's status, incarnation and spec, by id, and
    the incarnations given past them (``ChildChanges.given``)."""

    rows: dict[str, tuple[ChildStatus, int, ChildSpec]]
    given: dict[str, int]


def changes_since(
    reported: Reported | None, children: Iterable[ChildInfo], given: dict[str, int]
) -> tuple[ChildChanges | None, Reported]:
    """What changed from `reported` (None: nothing reported yet, so all of it) to `children`
    (in child order; `given`: the last incarnation given to each id), and the new report. A
    child whose spec is another object than the one reported (deleted, then added again with
    the same id) is deleted and added: an added child goes to the end of the list, as
    ``start_child`` puts it."""
    rows = list(children)
    now = Reported({c.id: (c.status, c.incarnation, c.spec) for c in rows}, {})
    now.given.update((i, n) for i, n in given.items() if i not in now.rows or n > now.rows[i][1])
    if reported is None:
        return ChildChanges(True, tuple(rows), (), dict(now.given) or None), now
    deleted = tuple(
        i for i, was in reported.rows.items() if i not in now.rows or now.rows[i][2] is not was[2]
    )
    changed = tuple(c for c in rows if reported.rows.get(c.id) != now.rows[c.id] or c.id in deleted)
    touched = {c.id for c in changed} | set(deleted)
    ahead = {i: n for i, n in now.given.items() if reported.given.get(i) != n or i in touched}
    if not changed and not deleted and not ahead:
        return None, now
    return ChildChanges(False, changed, deleted, ahead or None), now
