"""The journal's last run, as a takeover reads it: its app record, processes, actor starts,
restarts, agent tokens, child lists and owned trees (folded by _runtime/_journalstate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._core._livetree import LiveTree
from .._runtime._journalstate import Stamp, fold


@dataclass
class LastRun:
    """The journal's last run: its app record, processes, actor starts and restarts."""

    app: dict[str, Any] | None = None
    procs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Actor path -> (its last incarnation, the id of the process it started in).
    actors: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Supervisor path -> the times, oldest first, of its restarts that a later intensity
    #: check may still count.
    restarts: dict[str, list[Stamp]] = field(default_factory=dict)
    #: Rank -> its agent's registration tokens: (the next it holds, the one it presented last).
    tokens: dict[int, tuple[bytes, bytes | None]] = field(default_factory=dict)
    #: Each supervisor's child list.
    live: LiveTree = field(default_factory=LiveTree)
    #: The trees that actors own, running, by root path.
    owned: dict[str, dict[str, Any]] = field(default_factory=dict)


def last_run(records: list[dict[str, Any]]) -> LastRun:
    """The journal's last run; an empty one if it stopped in order (or there was none)."""
    state = fold(records)
    if state.app is None:
        return LastRun()
    actors = {path: (int(r["incarnation"]), str(r["proc"])) for path, r in state.actors.items()}
    tokens = {
        rank: (bytes.fromhex(str(r["next"])), _hex(r.get("presented")))
        for rank, r in state.tokens.items()
    }
    return LastRun(state.app, state.procs, actors, state.restarts, tokens, state.live, state.owned)


def _hex(text: object) -> bytes | None:
    return None if text is None else bytes.fromhex(str(text))
