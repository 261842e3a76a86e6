"""The live tree in the takeover journal, the controller's side (_core/_livetree.py has the
records): what each supervisor driver writes at the end of each operation of its core, and what
a standby's drivers resume each supervisor's child list from.

A child the declared tree holds as it is keeps no spec in the journal; one ``start_child``
added carries its spec, as wire data (_specwire.py) packed by the codec, in base64: a standby
rebuilds it with the spec classes, every check made again. One whose spec cannot travel (an
argument the codec refuses) is journalled without it and named when a standby cannot resume it.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .._core._children import ChildChanges, ChildInfo, ChildStatus
from .._core._errors import EncodeError, ProtocolError
from .._core._livetree import LiveTree, change_record
from .._core._spec import ChildSpec
from .._core._spec_errors import SpecError
from .._runtime._statedir import TakeoverState
from .._wire._codec import pack, unpack
from ._specwire import spec_from_wire, spec_to_wire

log = logging.getLogger("otpmesh.takeover")

#: What a row keeps of a spec the codec cannot carry: the standby names that child.
UNKNOWN = ""


def encode_spec(spec: ChildSpec) -> str:
    try:
        return base64.b64encode(pack(spec_to_wire(spec))).decode()
    except EncodeError:
        return UNKNOWN


def decode_spec(text: str) -> ChildSpec:
    """The spec `text` encodes; ValueError if it is none (damaged, or unknown)."""
    try:
        return spec_from_wire(unpack(base64.b64decode(text, validate=True)))
    except (binascii.Error, ProtocolError, SpecError, TypeError) as exc:
        raise ValueError(str(exc) or "not a spec") from None


class LiveJournal:
    """Writes each supervisor's child list to a takeover's journal (`state`); and for a
    standby, what the journal it took over held (`live`, with `actors`: the last incarnation
    of each actor it saw started, and `pids`: the process each started in), for each
    supervisor to resume from."""

    def __init__(
        self,
        state: TakeoverState,
        live: LiveTree | None = None,
        actors: Mapping[str, int] | None = None,
        pids: Mapping[str, int] | None = None,
    ) -> None:
        self._state = state
        self._live = live
        self._actors = dict(actors or {})
        self._pids = dict(pids or {})
        #: The children a standby found in the journal and could not resume (path: why).
        self.not_resumed: dict[str, str] = {}

    def changed(
        self, path: str, incarnation: int, changes: ChildChanges, declared: Sequence[ChildSpec]
    ) -> None:
        """Journal what changed in the child list of incarnation `incarnation` of the
        supervisor at `path` (its declared children: `declared`)."""

        def spec_of(row: ChildInfo) -> str | None:
            return None if any(c is row.spec for c in declared) else encode_spec(row.spec)

        self._state.tree_changed(change_record(path, incarnation, changes, spec_of))

    def pid_of(self, path: str) -> int:
        """The pid of the process the journal last saw the actor at `path` started in (0)."""
        return self._pids.get(path, 0)

    def given(self, path: str) -> dict[str, int]:
        """The incarnations the journal gave past the rows of the supervisor at `path`."""
        return self._live.given(path) if self._live is not None else {}

    def has(self, path: str) -> bool:
        """Whether the journal it took over holds a child list of the supervisor at `path`."""
        return self._live is not None and path in self._live.sups

    def forget(self, root: str) -> None:
        """Resume nothing at or under `root` (a tree whose owner died in the gap: the
        owner's restart starts a new one)."""
        if self._live is not None:
            for path in [p for p in self._live.sups if p == root or p.startswith(root + "/")]:
                del self._live.sups[path]

    def resume(
        self, path: str, incarnation: int, declared: Sequence[ChildSpec]
    ) -> list[ChildInfo] | None:
        """The child list incarnation `incarnation` of the supervisor at `path` had, as the
        journal kept it (once: a later start of it is a start); None if it kept none. A row
        whose spec is gone (another tree's, a spec that cannot be rebuilt) is left out, and
        said."""
        if self._live is None:
            return None
        rows = self._live.rows(path, incarnation, self._actors)
        if rows is None:
            return None
        self._live.sups.pop(path, None)  # resumed once; its next start is a start
        by_id = {c.id: c for c in declared}
        children = []
        for row in rows:
            child_id, status, number, *spec = row
            try:
                source = _source(spec, by_id.get(child_id))
            except ValueError as exc:
                self.not_resumed[f"{path}/{child_id}"] = str(exc)
                continue
            children.append(ChildInfo(child_id, ChildStatus(status), number, source))
        return children


def _source(spec: list[Any], declared: ChildSpec | None) -> ChildSpec:
    if not spec:
        if declared is None:
            raise ValueError("this program's tree does not declare it")
        return declared
    if spec[0] == UNKNOWN:
        raise ValueError("its spec could not be journalled (the codec refused an argument)")
    return decode_spec(str(spec[0]))
