"""The live tree as a takeover's journal keeps it: each supervisor's child list, folded from
what its core reported (``SupervisorCore.take_changes``) at the end of each operation. Pure:
the records are plain data; the journal (_runtime/_journalstate.py) and the reference model
(otpmesh.testing) fold the same ones.

Two records, by the key that names them (a supervisor's path):

- ``{"tree": path, "incarnation": n, "children": [row, ...]}``: the whole child list of
  incarnation `n` of that supervisor (its first report: it replaces any earlier one);
- ``{"changed": path, "incarnation": n, "rows": [row, ...], "deleted": [id, ...]}``: what
  changed since.

Either may hold ``"given": {id: n}``: the last incarnation given to a child, where that is
past its row's (its last start never ran: ignored, failed) or it has no row (it is gone; the
next ``start_child`` of its id goes on counting from there).

A row is ``[id, status, incarnation]``, or ``[id, status, incarnation, spec]`` for a child the
declared tree does not hold as it is (``start_child`` added it): `spec` is the child's spec in
whatever form the writer chose (the journal: encoded; the model: the spec itself), opaque here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._children import ChildChanges, ChildInfo, ChildStatus

Row = list[Any]
"""``[id, status, incarnation]`` or ``[id, status, incarnation, spec]``."""

STATUSES = frozenset(s.value for s in ChildStatus)


def change_record(
    path: str, incarnation: int, changes: ChildChanges, spec_of: Callable[[ChildInfo], Any]
) -> dict[str, Any]:
    """The record for `changes` of incarnation `incarnation` of the supervisor at `path`;
    `spec_of(row)` is what the row keeps of its spec (None: the declared one)."""
    rows = [_row(info, spec_of(info)) for info in changes.rows]
    record: dict[str, Any]
    if changes.full:
        record = {"tree": path, "incarnation": incarnation, "children": rows}
    else:
        record = {"changed": path, "incarnation": incarnation, "rows": rows}
        record["deleted"] = list(changes.deleted)
    if changes.given:
        record["given"] = dict(changes.given)
    return record


def _row(info: ChildInfo, spec: Any) -> Row:
    row: Row = [info.id, info.status.value, info.incarnation]
    return row if spec is None else [*row, spec]


@dataclass
class _Sup:
    incarnation: int
    rows: dict[str, Row] = field(default_factory=dict)  # by id, in child order
    given: dict[str, int] = field(default_factory=dict)  # past a row's incarnation


@dataclass
class LiveTree:
    """Each supervisor's child list, by path, as the records say it is now."""

    sups: dict[str, _Sup] = field(default_factory=dict)

    def add(self, record: Mapping[str, Any]) -> None:
        if "tree" in record:
            sup = _Sup(int(record["incarnation"]))
            sup.rows = {str(row[0]): list(row) for row in record["children"]}
            sup.given = dict(record.get("given", {}))
            self.sups[str(record["tree"])] = sup
            return
        sup_or_none = self.sups.get(str(record["changed"]))
        if sup_or_none is None or sup_or_none.incarnation != record["incarnation"]:
            return  # a change to a list this fold never saw whole: no state to change
        for child_id in record.get("deleted", ()):
            sup_or_none.rows.pop(str(child_id), None)
            sup_or_none.given.pop(str(child_id), None)
        for row in record["rows"]:
            sup_or_none.rows[str(row[0])] = list(row)  # a new id goes to the end
            sup_or_none.given.pop(str(row[0]), None)
        sup_or_none.given.update(record.get("given", {}))

    def rows(
        self, path: str, incarnation: int, actors: Mapping[str, int] | None = None
    ) -> list[Row] | None:
        """The child list of incarnation `incarnation` of the supervisor at `path`, in child
        order; None if the records hold none. A child whose actor the journal saw started
        as a later incarnation (`actors`: path -> the last one) than its row says is running
        as that one: the controller died in the operation that started it, before its end."""
        sup = self.sups.get(path)
        if sup is None or sup.incarnation != incarnation:
            return None
        out = []
        for child_id, row in sup.rows.items():
            started = (actors or {}).get(f"{path}/{child_id}", 0)
            if started > int(row[2]):
                row = [row[0], ChildStatus.RUNNING.value, started, *row[3:]]
            out.append(row)
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """The last incarnation given to each child of each supervisor the records hold,
        by the supervisor's path: where a standby's supervisors go on counting from, those
        it resumes and those it starts again later alike."""
        out: dict[str, dict[str, int]] = {}
        for path, sup in self.sups.items():
            given = {i: int(row[2]) for i, row in sup.rows.items()}
            for child_id, number in sup.given.items():
                given[child_id] = max(given.get(child_id, 0), int(number))
            out[path] = given
        return out

    def given(self, path: str) -> dict[str, int]:
        """The last incarnation given to children of the supervisor at `path`, where that is
        past their rows' or they have none (the module's docstring)."""
        sup = self.sups.get(path)
        return dict(sup.given) if sup is not None else {}

    def records(self) -> list[dict[str, Any]]:
        """One ``tree`` record per supervisor still in the tree: parents first. One whose
        parent's list no longer has it (deleted, a temporary one gone) is left out, and what
        was under it."""
        gone: set[str] = set()
        out = []
        for path in sorted(self.sups, key=lambda p: p.count("/")):
            sup = self.sups[path]
            parent, _, child_id = path.rpartition("/")
            above = self.sups.get(parent)
            if parent in gone or (above is not None and child_id not in above.rows):
                gone.add(path)
                continue
            record = {
                "tree": path,
                "incarnation": sup.incarnation,
                "children": [*sup.rows.values()],
            }
            out.append({**record, "given": dict(sup.given)} if sup.given else record)
        return out


def valid_rows(rows: object) -> bool:
    """Whether `rows` is a list of rows as the journal writes them (a spec as text)."""
    return type(rows) is list and all(
        type(row) is list
        and len(row) in (3, 4)
        and type(row[0]) is str
        and row[1] in STATUSES
        and type(row[2]) is int
        and row[2] >= 0
        and (len(row) == 3 or type(row[3]) is str)
        for row in rows
    )
