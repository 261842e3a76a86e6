"""``otpmesh.Takeover`` (what a tree that outlives its controller is run with, checked as it is
made) and ``otpmesh.Resumption`` (what ``app.resumed`` says of a takeover): the values the
takeover (_takeover.py) takes and gives."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._runtime._journal import COMPACT_BYTES

if TYPE_CHECKING:
    from .._runtime._controller_runtime import Runtime
    from .._runtime._proc import Proc
    from .._runtime._statedir import TakeoverState


class Hosts(Protocol):
    """The hosts part of a takeover (``otpmesh.TakeoverHosts``, _hosts/_hostover.py)."""

    async def attach(self, rt: Runtime) -> None: ...
    def witnesses(self) -> set[int]: ...
    def expect_tokens(self, tokens: dict[int, tuple[bytes, bytes | None]]) -> None: ...
    async def start_fresh(self, rt: Runtime, state: TakeoverState) -> None: ...
    async def adopt(
        self, rt: Runtime, state: TakeoverState, procs: list[dict[str, Any]]
    ) -> dict[str, Proc]: ...
    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Takeover:
    """Run a tree so that a standby controller can take it over when this one dies.

    `dir` is the state directory (made 0700, this user's alone). `grace` is how long, in
    seconds, workers and the fork server keep running (and keep their actors' state) without a
    controller before they exit. With `standby`, a start whose lease another controller holds
    waits for it instead of failing. `key` is what the app's secret is kept under in the
    journal (never in the clear): by default the user's otpmesh secret (``OTPMESH_SECRET``,
    ``OTPMESH_SECRET_FILE`` or ``~/.otpmesh/secret``, made if missing); the active controller
    and its standby need the same one.
    """

    dir: str | os.PathLike[str]
    grace: float = 30.0
    standby: bool = False
    #: The tree runs on host agents, which a standby on another host takes over too
    #: (``otpmesh.TakeoverHosts(launcher, listen=..., port=...)``; docs/guides/takeover.md).
    hosts: Hosts | None = None
    #: The journal is compacted to what is still true once it has grown this many bytes
    #: (docs/guides/takeover.md); the default suits any tree, a test may make it small.
    journal_bytes: int = COMPACT_BYTES
    key: bytes | None = field(default=None, repr=False)
    #: Take a running tree over even when this program's tree or actor code differs from the
    #: running controller's (by default it refuses and says what differs): adopted actors keep
    #: running the old code until they restart (docs/guides/takeover.md, "Running other code").
    upgrade: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.dir, str | os.PathLike) or not str(self.dir):
            raise TypeError(
                f"Takeover(dir=...) needs a directory path, not {self.dir!r}; e.g. "
                "Takeover(dir=os.path.expanduser('~/otpmesh-state/myjob')), a directory of your own"
            )
        grace = self.grace
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not (math.isfinite(grace) and grace > 0)
        ):
            raise ValueError(
                f"Takeover(grace=...) is how many seconds workers wait for a standby: a positive "
                f"number, not {grace!r}; e.g. grace=30.0"
            )
        if not isinstance(self.standby, bool):
            raise TypeError(f"Takeover(standby=...) is True or False, not {self.standby!r}")
        if not isinstance(self.upgrade, bool):
            raise TypeError(f"Takeover(upgrade=...) is True or False, not {self.upgrade!r}")
        key = self.key
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise ValueError(
                "Takeover(key=...) is the bytes the app's secret is kept under (16 or more, the "
                f"same for the active controller and its standby), not {_brief(key)}; e.g. "
                "key=open('/run/secrets/job-key', 'rb').read(), or leave it out to use "
                "~/.otpmesh/secret"
            )
        size = self.journal_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"Takeover(journal_bytes=...) is how many bytes the journal grows before it is "
                f"compacted: a positive int, not {size!r}; e.g. journal_bytes={COMPACT_BYTES}"
            )


@dataclass(frozen=True, slots=True)
class Resumption:
    """What ``app.resumed`` says when the app's start took a running tree over (None when it
    started afresh): this controller's fencing `epoch`, the pid of the controller it took over
    from (`previous_pid`), how many actors it found running and kept, state and all
    (`adopted`), how many children had died in the gap (`lost`: their exits went to their
    supervisors, whose rules restarted them or not), how many worker processes it adopted,
    and the `gap`: seconds from the previous controller's last journal write to this
    takeover (about how long the tree ran without a controller)."""

    epoch: int
    previous_pid: int
    adopted: int
    lost: int
    processes: int
    gap: float

    def __str__(self) -> str:
        return (
            f"epoch {self.epoch} took the tree over from pid {self.previous_pid} after "
            f"{self.gap:.2f} s: {self.adopted} actors adopted in {self.processes} processes, "
            f"{self.lost} lost in the gap"
        )


def _brief(value: object) -> str:
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return f"a {type(value).__name__}"
