"""What a supervisor driver (_driver.py) uses of the running tree it belongs to: a Protocol, so
that the driver need not import the tree (_tree.py's ``TreeContext``, which holds the drivers,
implements it)."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .._core._healspec import Heal
from .._core._supevents import Reply
from .._node._slot import Slot
from ._events import EventLog
from ._livejournal import LiveJournal
from ._placement import Placement


class DriverContext(Protocol):
    """A running tree, as its supervisor drivers see it."""

    events: EventLog
    mesh_shapes: dict[str, dict[str, int]]
    mesh_heals: dict[str, Heal]
    nursery: trio.Nursery
    placement: Placement
    #: A takeover's journal of each supervisor's child list (None: no takeover).
    live_journal: LiveJournal | None

    def incarnations(self, sup_path: str) -> dict[str, int]:
        """The incarnation counters of a supervisor's children, kept across its restarts."""
        ...

    def restart_history(self, sup_path: str) -> tuple[float, ...]:
        """The restart times (newest first, this run's clock) a takeover carried over for the
        supervisor at `sup_path`, once: a later core of it (restarted) starts with none."""
        ...

    def restarted(self, sup_path: str, window: tuple[float, ...]) -> None:
        """The supervisor at `sup_path` restarted a child: `window` holds the times (this run's
        clock, newest, this restart's, first) of its restarts inside its intensity period."""
        ...

    def slot(self, path: str) -> Slot: ...
    def has_slot(self, path: str) -> bool:
        """Whether the actor at `path` has ever been placed (``slot`` would make one)."""
        ...

    def slots_under(self, sup_path: str) -> list[tuple[str, Slot]]: ...
    def injected_start_failure(self, path: str) -> object: ...
    def watch(self, path: str, driver: Any) -> None:
        """Send the exits of the actor at `path` to `driver` (a ``SupervisorDriver``)."""
        ...

    def stop_begun(self, path: str) -> None: ...
    def stop_ended(self, path: str) -> None: ...
    def last_exit(self, sup_path: str, child_id: str) -> object: ...
    def work_started(self) -> None: ...
    def work_done(self) -> None: ...
    def reply(self, reply: Reply) -> None: ...
    def root_exited(self, reason: object) -> None: ...
    def learn(self, sup_path: str, spec: Any) -> None:
        """A child a takeover resumed that ``start_child`` had added: its paths are the
        tree's."""
        ...

    def lost(self, driver: Any, child_id: str, incarnation: int, reason: object) -> None:
        """A takeover found this child of `driver` (a ``SupervisorDriver``) gone: its exit is
        reported once the whole tree is resumed."""
        ...
