"""The vocabulary of the sans-IO supervisor core: events in, commands out, log entries.

Children are named by id; a running child is further named by its *incarnation*, a per-id count
of starts (1, 2, ...). Incarnations play the part of OTP's pids: an exit reported for an
incarnation that is no longer current is ignored (OTP rule 18 in docs/otp-rules.md), which makes
races between a driver and the core harmless.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._exits import describe
from ._reasons import SHUTDOWN
from ._spec import ChildSpec, ShutdownSpec

# ---- commands: what the driver must do ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartChild:
    """Start `spec` as incarnation `incarnation` of child `id`.

    The driver answers with exactly one of ChildStarted, StartIgnored or StartFailed. A Supervisor
    child counts as started once its own core has emitted InitDone (its subtree is up). A Mesh
    child arrives as written: run it as ``spec.as_supervisor()``, one actor per slot.
    """

    id: str
    incarnation: int
    spec: ChildSpec
    #: A takeover's resume: the child runs (the journal says so) as this incarnation; take it
    #: over (ChildStarted, adopted) or say it is gone (ChildLost), never start it.
    adopt: bool = False


@dataclass(frozen=True, slots=True)
class TerminateChild:
    """Stop incarnation `incarnation` of child `id`; answer with ChildTerminated.

    ``BRUTAL_KILL``: kill at once (reason 'killed'). A number: ask it to stop with reason
    'shutdown' (stop hook), kill it if it is still alive after that many seconds. ``INFINITY``: ask
    and wait. A child that had already died is answered with the reason it died with; a child
    supervisor is stopped by sending Stop('shutdown') to its core.
    """

    id: str
    incarnation: int
    shutdown: ShutdownSpec


@dataclass(frozen=True, slots=True)
class InitDone:
    """Every child of the initial start is up: report this supervisor as started to its parent."""


@dataclass(frozen=True, slots=True)
class InitFailed:
    """The initial start failed; the children that did start are already stopped.

    Report a start failure with `reason` to the parent (OTP: ``start_link`` returns an error).
    """

    reason: object


@dataclass(frozen=True, slots=True)
class Exit:
    """The supervisor is done and exits with `reason`; all its children are already stopped."""

    reason: object


class Outcome(enum.StrEnum):
    """Results of the dynamic-children requests, OTP's return values."""

    OK = "ok"  # started / terminated / deleted
    IGNORED = "ignored"  # {ok, undefined}: the start returned ignore
    ALREADY_STARTED = "already_started"
    ALREADY_PRESENT = "already_present"
    RUNNING = "running"
    RESTARTING = "restarting"
    NOT_FOUND = "not_found"
    START_ERROR = "start_error"  # reason: the start failure's reason
    INVALID_SPEC = "invalid_spec"  # reason: the SpecError


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to the dynamic-children request `ref`."""

    ref: object
    outcome: Outcome
    reason: object = None


Command = StartChild | TerminateChild | InitDone | InitFailed | Exit | Reply

# ---- events: what happened ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildStarted:
    """The pending StartChild succeeded; `adopted`: its actor was already running in a process
    a controller that took the tree over adopted (a takeover), and was taken as started."""

    id: str
    adopted: bool = False


@dataclass(frozen=True, slots=True)
class ChildLost:
    """The child a StartChild with ``adopt`` names is gone (it died while no controller ran):
    it stays running for the core, and the driver reports its exit (`reason`) once the whole
    tree is resumed."""

    id: str
    reason: object


@dataclass(frozen=True, slots=True)
class StartIgnored:
    """The pending StartChild's start returned 'ignore' (OTP's ``ignore``): not running, kept."""

    id: str


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The pending StartChild failed with `reason` (constructor or start hook raised, ...)."""

    id: str
    reason: object


@dataclass(frozen=True, slots=True)
class ChildExited:
    """Incarnation `incarnation` of child `id` exited by itself with `reason`."""

    id: str
    incarnation: int
    reason: object


@dataclass(frozen=True, slots=True)
class ChildTerminated:
    """The pending TerminateChild is done; the child exited with `reason`."""

    id: str
    incarnation: int
    reason: object


@dataclass(frozen=True, slots=True)
class Stop:
    """The parent (or the application) asks this supervisor to stop with `reason`."""

    reason: object = SHUTDOWN


@dataclass(frozen=True, slots=True)
class StartChildRequest:
    """OTP's ``start_child``: add `spec` at the end of the start order and start it."""

    ref: object
    spec: ChildSpec


@dataclass(frozen=True, slots=True)
class TerminateChildRequest:
    """OTP's ``terminate_child``: stop the child, keep its spec (unless temporary)."""

    ref: object
    id: str


@dataclass(frozen=True, slots=True)
class RestartChildRequest:
    """OTP's ``restart_child``: start a child whose spec is kept but that is not running."""

    ref: object
    id: str


@dataclass(frozen=True, slots=True)
class DeleteChildRequest:
    """OTP's ``delete_child``: forget the spec of a child that is not running."""

    ref: object
    id: str


Completion = ChildStarted | ChildLost | StartIgnored | StartFailed | ChildTerminated
Request = StartChildRequest | TerminateChildRequest | RestartChildRequest | DeleteChildRequest
Event = Completion | ChildExited | Stop | Request

# ---- the event log --------------------------------------------------------------------------


class LogKind(enum.StrEnum):
    """What a log entry records."""

    SUPERVISOR_STARTED = "supervisor_started"
    CHILD_STARTED = "child_started"
    START_FAILED = "start_failed"
    START_IGNORED = "start_ignored"
    CHILD_EXITED = "child_exited"
    CHILD_TERMINATED = "child_terminated"
    SHUTDOWN_ERROR = "shutdown_error"  # a terminated child exited with an unexpected reason
    RESTART_INTENSITY_REACHED = "restart_intensity_reached"
    ESCALATED = "escalated"
    AUTO_SHUTDOWN = "auto_shutdown"
    SUPERVISOR_EXITED = "supervisor_exited"
    FAULT_INJECTED = "fault_injected"  # otpmesh.chaos: what was done, beside what it caused
    CHILD_ADOPTED = "child_adopted"  # a takeover found the child running: started, not restarted
    TAKEOVER = "takeover"  # a controller took the tree over (the reason says from whom, what)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One supervision step: structured data, never a formatted string (OTP's reports)."""

    time: float
    kind: LogKind
    path: str  # the supervisor's path
    child: str | None = None
    incarnation: int | None = None
    reason: object = None

    @property
    def child_path(self) -> str:
        """The path of the child concerned, or the supervisor's own path."""
        return f"{self.path}/{self.child}" if self.child is not None else self.path

    def reason_text(self) -> str | None:
        """The reason in words; a chaos fault's reason already is words (what was done)."""
        if self.reason is None:
            return None
        if self.kind in (LogKind.FAULT_INJECTED, LogKind.TAKEOVER):
            return str(self.reason)
        return describe(self.reason)

    def __str__(self) -> str:
        """One readable line: kind, path, #incarnation, (reason in words)."""
        incarnation = "" if self.incarnation is None else f" #{self.incarnation}"
        reason = "" if self.reason is None else f"  ({self.reason_text()})"
        return f"{self.kind:<26}{self.child_path}{incarnation}{reason}"
