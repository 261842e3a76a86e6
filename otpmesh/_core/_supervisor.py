"""The sans-IO supervisor core: OTP 25's ``supervisor`` for ONE supervisor, as a state machine.

OTP's supervisor is sequential code: it starts or stops one child and waits for the result before
doing anything else, and messages that arrive meanwhile wait in its mailbox. The core keeps that
shape by writing each operation as a generator that *yields* a command (StartChild,
TerminateChild) and is *sent* the completion event; ``handle`` resumes it. Events that are not the
awaited completion (exits, stop requests, dynamic-children requests) go to a FIFO mailbox, exactly
where OTP would leave them. The functions below follow supervisor.erl's (named in their
docstrings) so the two can be read side by side.

Driver loop::

    core = SupervisorCore(spec, path="rl")
    commands = core.start(now)
    while not core.done:
        for cmd in commands:
            ...  # StartChild / TerminateChild: do it, later feed the completion event
                 # InitDone / InitFailed / Exit / Reply: forward to the parent / the caller
        commands = core.handle(await next_event(), now)
        forward(core.take_log())

At most one StartChild/TerminateChild is outstanding at a time, and it is the last command of a
batch; except that a supervisor with ``parallel_shutdown`` (a Mesh's group, as OTP's
``simple_one_for_one``) terminates a set of children with one batch of TerminateChild commands,
all outstanding together, and goes on once every one is answered (in any order). Nested
supervisors are separate cores; a child supervisor's Exit is, for its parent, an ordinary
ChildExited.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass

from ._children import ChildChanges, ChildInfo, ChildStatus, Reported, changes_since
from ._intensity import Restarts, add_restart, intensity_exceeded
from ._reasons import KILLED, NORMAL, SHUTDOWN, failed_to_start_child, is_shutdown_tuple
from ._reasons import is_normal_exit as _normal
from ._spec import (
    AutoShutdown,
    ChildSpec,
    Restart,
    Shutdown,
    ShutdownSpec,
    Strategy,
    Supervisor,
    Worker,
    as_core_spec,
    check_sibling,
)
from ._spec_errors import SpecError, SupervisorProtocolError
from ._supevents import (
    ChildExited,
    ChildLost,
    ChildStarted,
    ChildTerminated,
    Command,
    Completion,
    DeleteChildRequest,
    Event,
    Exit,
    InitDone,
    InitFailed,
    LogEntry,
    LogKind,
    Outcome,
    Reply,
    RestartChildRequest,
    StartChild,
    StartChildRequest,
    StartFailed,
    StartIgnored,
    Stop,
    TerminateChild,
    TerminateChildRequest,
)


@dataclass(slots=True)
class _Child:
    source: ChildSpec  # as written; the driver needs a Mesh's shape to place its actors
    status: ChildStatus = ChildStatus.UNDEFINED
    incarnation: int = 0

    @property
    def spec(self) -> Supervisor | Worker:
        """What the core runs: a Mesh is its group supervisor (shutdown INFINITY)."""
        return as_core_spec(self.source)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def restart(self) -> Restart:
        return self.spec.restart


@dataclass(frozen=True, slots=True)
class _TryAgain:
    """OTP's ``{try_again_restart, Id}`` cast to itself: queued behind what is already waiting."""

    id: str


@dataclass(frozen=True, slots=True)
class _ExitWith:
    """Returned by an operation that ends the supervisor (reasons may be any value, even None)."""

    reason: object


class _Receive:
    """Yielded by the main loop: wait for the next mailbox message."""


@dataclass(frozen=True, slots=True)
class _AwaitAll:
    """Yielded by a parallel termination: these TerminateChild commands are outstanding (issued
    now if `new`); the operation is resumed with each ChildTerminated as it comes."""

    pending: tuple[TerminateChild, ...]
    new: bool


_RECEIVE = _Receive()
_COMPLETIONS = (ChildStarted, ChildLost, StartIgnored, StartFailed, ChildTerminated)
_Awaited = StartChild | TerminateChild | _AwaitAll
_Op = Generator[_Awaited | _Receive, object, "_ExitWith | None"]


class Phase(enum.StrEnum):
    """Where a core is in its life."""

    NEW = "new"
    STARTING = "starting"  # the initial start of the children (OTP's init/1)
    RUNNING = "running"
    DONE = "done"  # InitFailed or Exit was emitted


class SupervisorCore:
    """One supervisor's state machine. Pure: no I/O, no clock, no randomness."""

    def __init__(
        self,
        spec: Supervisor,
        *,
        path: str | None = None,
        incarnations: dict[str, int] | None = None,
        restarts: Restarts = (),
        resume: list[ChildInfo] | None = None,
    ) -> None:
        if not isinstance(spec, Supervisor):
            raise TypeError(f"SupervisorCore needs a Supervisor spec, got {spec!r}")
        self.spec = spec
        self.path = path if path is not None else spec.id
        # A takeover resumes a supervisor's child list as the journal left it (_livetree.py):
        # its start then adopts what runs instead of starting the declared children.
        self._resuming = resume is not None
        if resume is None:
            self._children = [_Child(c) for c in spec.children]
        else:
            self._children = [_Child(c.spec, c.status, c.incarnation) for c in resume]
        # Restart times newest first; a takeover carries a supervisor's over from the
        # controller that died (their times in this driver's clock).
        self._restarts: Restarts = tuple(restarts)
        self._mailbox: deque[Event | _TryAgain] = deque()
        # Per child id, the last incarnation number given. A driver that re-creates a core (its
        # supervisor restarted) passes the same dict, so (path, incarnation) stays unique.
        self._incarnations: dict[str, int] = incarnations if incarnations is not None else {}
        for child in self._children if resume is not None else ():
            given = self._incarnations.get(child.id, 0)
            self._incarnations[child.id] = max(given, child.incarnation)
        self._reported: Reported | None = None  # the child list as take_changes last said
        self._log: list[LogEntry] = []
        self._out: list[Command] = []
        self._op: _Op | None = None
        self._awaiting: _Awaited | _Receive | None = None
        self._now = float("-inf")
        self._phase = Phase.NEW
        self.exit_reason: object = None

    # ---- the driver's interface -------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def done(self) -> bool:
        """True once InitFailed or Exit was emitted; only late exits and stops are accepted then."""
        return self._phase is Phase.DONE

    @property
    def idle(self) -> bool:
        """True when nothing is outstanding and the mailbox is empty (the supervisor waits)."""
        return self._awaiting is _RECEIVE and not self._mailbox

    @property
    def awaiting(self) -> StartChild | TerminateChild | None:
        """The command whose completion the core waits for, if any (the oldest of several
        during a parallel shutdown: see ``outstanding``)."""
        outstanding = self.outstanding
        return outstanding[0] if outstanding else None

    @property
    def outstanding(self) -> tuple[StartChild | TerminateChild, ...]:
        """Every command whose completion the core waits for: one, or during a parallel
        shutdown every TerminateChild not yet answered."""
        if isinstance(self._awaiting, _AwaitAll):
            return self._awaiting.pending
        if isinstance(self._awaiting, StartChild | TerminateChild):
            return (self._awaiting,)
        return ()

    def start(self, now: float) -> list[Command]:
        """Begin the initial start of the children, in order (OTP's ``init/1``)."""
        if self._phase is not Phase.NEW:
            raise SupervisorProtocolError(f"{self.path}: start() called twice")
        self._tick(now)
        self._phase = Phase.STARTING
        self._op = self._main()
        self._resume(None)
        return self._take_out()

    def handle(self, event: Event, now: float) -> list[Command]:
        """Feed one event at time `now` (seconds, non-decreasing); return the commands it causes."""
        self._tick(now)
        if self._phase is Phase.NEW:
            raise SupervisorProtocolError(f"{self.path}: call start(now) before handle()")
        if self._phase is Phase.DONE:
            if isinstance(event, ChildExited | Stop):
                return []  # a late exit, or a stop that crossed the supervisor's own exit
            raise SupervisorProtocolError(f"{self.path}: {event!r} after the supervisor exited")
        if isinstance(
            event, ChildStarted | ChildLost | StartIgnored | StartFailed | ChildTerminated
        ):
            self._resume(self._check_completion(event))
        else:
            self._mailbox.append(event)
            if self._awaiting is _RECEIVE:
                self._resume(self._mailbox.popleft())
        return self._take_out()

    def take_log(self) -> list[LogEntry]:
        """The log entries since the last call, oldest first, for the driver to forward."""
        log, self._log = self._log, []
        return log

    def which_children(self) -> list[ChildInfo]:
        """The children, newest first (reverse start order), as OTP's ``which_children``."""
        return [
            ChildInfo(c.id, c.status, c.incarnation, c.source) for c in reversed(self._children)
        ]

    def take_changes(self) -> ChildChanges | None:
        """What changed in the child list since the last call (all of it at the first), or
        None: what a takeover journals (_livetree.py). Call it when the core is idle, between
        operations: a list taken in the middle of one (a group half restarted) is no state a
        standby could resume."""
        rows = ((c.source.id, c.status, c.incarnation, c.source) for c in self._children)
        changes, self._reported = changes_since(self._reported, rows, self._incarnations)
        return changes

    @property
    def restarts(self) -> Restarts:
        """The restart times still inside the intensity window, newest first."""
        return self._restarts

    # ---- plumbing ---------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        if now < self._now:
            raise SupervisorProtocolError(
                f"{self.path}: time went backwards ({now} < {self._now}); use one monotonic clock"
            )
        self._now = float(now)

    def _take_out(self) -> list[Command]:
        out, self._out = self._out, []
        return out

    def _check_completion(self, event: Completion) -> Completion:
        want = self._awaiting
        if isinstance(want, StartChild) and not isinstance(event, ChildTerminated):
            if event.id == want.id:
                return event
        elif isinstance(want, TerminateChild) and isinstance(event, ChildTerminated):
            if (event.id, event.incarnation) == (want.id, want.incarnation):
                return event
        elif isinstance(want, _AwaitAll) and isinstance(event, ChildTerminated):
            if any((event.id, event.incarnation) == (c.id, c.incarnation) for c in want.pending):
                return event
        raise SupervisorProtocolError(
            f"{self.path}: got {event!r} while waiting for {want!r}; report each command's "
            "completion once, for the command the core issued"
        )

    def _resume(self, value: object) -> None:
        """Run the current operation until it needs something from outside."""
        if self._op is None:
            return
        while True:
            try:
                step = self._op.send(value)
            except StopIteration:
                self._op, self._awaiting, self._phase = None, None, Phase.DONE
                return
            if isinstance(step, _Receive):
                if self._mailbox:
                    value = self._mailbox.popleft()
                    continue
                self._awaiting = step
                return
            self._awaiting = step
            if isinstance(step, _AwaitAll):
                if step.new:
                    self._out.extend(step.pending)
            else:
                self._out.append(step)
            return

    def _record(
        self,
        kind: LogKind,
        child: _Child | None = None,
        reason: object = None,
        incarnation: int | None = None,
    ) -> None:
        if child is not None and incarnation is None:
            incarnation = child.incarnation
        self._log.append(
            LogEntry(self._now, kind, self.path, child.id if child else None, incarnation, reason)
        )

    def _find(self, child_id: str) -> _Child | None:
        return next((c for c in self._children if c.id == child_id), None)

    def _del_child(self, child: _Child) -> None:
        """OTP's ``del_child``: a temporary child's spec goes, any other's stays, not running."""
        if child.restart is Restart.TEMPORARY:
            self._children.remove(child)
        else:
            child.status = ChildStatus.UNDEFINED

    # ---- the supervisor's life --------------------------------------------------------------

    def _main(self) -> _Op:
        if self._resuming:
            yield from self._resume_children()
        elif not (yield from self._init_children()):
            return None
        self._phase = Phase.RUNNING
        self._record(LogKind.SUPERVISOR_STARTED)
        self._out.append(InitDone())
        while True:
            message = yield _RECEIVE
            ending = yield from self._dispatch(message)
            if ending is not None:
                # OTP's terminate/2: stop every child, newest first, then exit.
                yield from self._terminate_children(list(self._children))
                self._record(LogKind.SUPERVISOR_EXITED, reason=ending.reason)
                self.exit_reason = ending.reason
                self._out.append(Exit(ending.reason))
                return None

    def _init_children(self) -> Generator[_Awaited | _Receive, object, bool]:
        """OTP's ``init_children``: start in order; on a failure stop the started, newest first."""
        for child in list(self._children):
            event = yield from self._start(child)
            if isinstance(event, StartIgnored) and child.restart is Restart.TEMPORARY:
                self._children.remove(child)
            elif isinstance(event, StartFailed):
                yield from self._terminate_children(list(self._children))
                reason = failed_to_start_child(child.id, event.reason)
                self._record(LogKind.SUPERVISOR_EXITED, reason=reason)
                self.exit_reason = reason
                self._out.append(InitFailed(reason))
                return False
        return True

    def _resume_children(self) -> _Op:
        """A takeover's start: each child the journal has running is adopted, in order (its
        exit, if it died while no controller ran, is the driver's to report once the whole
        tree is resumed: then OTP's rules decide, as for any exit); a retry loop the journal
        saw under way goes on. Nothing is started: no start can fail here."""
        for child in list(self._children):
            if child.status is ChildStatus.RESTARTING:
                self._mailbox.append(_TryAgain(child.id))
            elif child.status is ChildStatus.RUNNING:
                event = yield StartChild(child.id, child.incarnation, child.source, adopt=True)
                if isinstance(event, ChildStarted):
                    self._record(LogKind.CHILD_ADOPTED, child)
                elif not isinstance(event, ChildLost):
                    raise SupervisorProtocolError(
                        f"{self.path}: {event!r} answers an adoption: ChildStarted or ChildLost"
                    )
        return None

    def _dispatch(self, message: object) -> _Op:
        if isinstance(message, ChildExited):
            child = self._find(message.id)
            if (
                child is None
                or child.status is not ChildStatus.RUNNING
                or child.incarnation != message.incarnation
            ):
                return None  # not a current child: OTP rule 18 (docs/otp-rules.md)
            return (yield from self._do_restart(child, message.reason))
        if isinstance(message, _TryAgain):
            child = self._find(message.id)
            if child is None or child.status is not ChildStatus.RESTARTING:
                return None  # terminate_child/delete_child ended the retry loop meanwhile
            return (yield from self._restart(child, None))
        if isinstance(message, Stop):
            return _ExitWith(message.reason)
        if isinstance(message, StartChildRequest):
            yield from self._handle_start_child(message)
        elif isinstance(message, TerminateChildRequest):
            yield from self._handle_terminate_child(message)
        elif isinstance(message, RestartChildRequest):
            yield from self._handle_restart_child(message)
        elif isinstance(message, DeleteChildRequest):
            self._handle_delete_child(message)
        else:
            raise SupervisorProtocolError(f"{self.path}: unknown event {message!r}")
        return None

    # ---- a child exited: restart types and strategies ---------------------------------------

    def _do_restart(self, child: _Child, reason: object) -> _Op:
        """OTP's ``do_restart/3``: permanent always, transient if abnormal, temporary never."""
        self._record(LogKind.CHILD_EXITED, child, reason)
        restarts = child.restart is Restart.PERMANENT or (
            child.restart is Restart.TRANSIENT and not _normal(reason)
        )
        if not restarts:
            self._del_child(child)
            return self._auto_shutdown(child)
        if self.spec.strategy is Strategy.ESCALATE:
            self._record(LogKind.ESCALATED, child, reason)
            self._del_child(child)
            return _ExitWith(reason)
        return (yield from self._restart(child, reason))

    def _auto_shutdown(self, child: _Child) -> _ExitWith | None:
        """OTP's ``do_auto_shutdown``: only after a significant child's non-restarted exit."""
        mode = self.spec.auto_shutdown
        if mode is AutoShutdown.NEVER or not child.spec.significant:
            return None
        if mode is AutoShutdown.ALL_SIGNIFICANT and any(
            c.spec.significant and c.status is not ChildStatus.UNDEFINED for c in self._children
        ):
            return None
        self._record(LogKind.AUTO_SHUTDOWN, child)
        return _ExitWith(SHUTDOWN)

    def _restart(self, child: _Child, reason: object) -> _Op:
        """OTP's ``restart/2``: count one restart, then apply the strategy."""
        self._restarts = add_restart(self._restarts, self._now, self.spec.period)
        if intensity_exceeded(self._restarts, self.spec.intensity):
            self._record(LogKind.RESTART_INTENSITY_REACHED, child, reason)
            self._del_child(child)
            return _ExitWith(SHUTDOWN)
        strategy = self.spec.strategy
        if strategy is Strategy.ONE_FOR_ONE:
            event = yield from self._start(child)
            if isinstance(event, StartFailed):
                self._retry_later(child)
        elif strategy is Strategy.REST_FOR_ONE:
            child.status = ChildStatus.UNDEFINED
            yield from self._restart_group(self._children[self._children.index(child) :])
        else:  # ONE_FOR_ALL; ESCALATE never gets here
            child.status = ChildStatus.UNDEFINED
            yield from self._restart_group(list(self._children))
        return None

    def _restart_group(self, group: list[_Child]) -> _Op:
        """OTP's ``restart_multiple_children``: stop the group newest first, start it in order."""
        yield from self._terminate_children(group)
        for child in [c for c in group if c in self._children]:
            event = yield from self._start(child)
            if isinstance(event, StartFailed):
                self._retry_later(child)  # the rest of the group stays stopped until the retry
                return None
        return None

    def _retry_later(self, child: _Child) -> None:
        """A start failed during a restart: mark it restarting and queue a retry.

        OTP rule 29 (docs/otp-rules.md).
        """
        child.status = ChildStatus.RESTARTING
        self._mailbox.append(_TryAgain(child.id))

    # ---- starting and stopping one child ----------------------------------------------------

    def _start(self, child: _Child) -> Generator[_Awaited | _Receive, object, Completion]:
        """Start one child and wait for the result; a success makes it RUNNING."""
        incarnation = self._incarnations.get(child.id, 0) + 1
        self._incarnations[child.id] = incarnation
        event = yield StartChild(child.id, incarnation, child.source)
        if isinstance(event, ChildStarted):
            child.status, child.incarnation = ChildStatus.RUNNING, incarnation
            self._record(LogKind.CHILD_ADOPTED if event.adopted else LogKind.CHILD_STARTED, child)
        elif isinstance(event, StartIgnored):
            child.status = ChildStatus.UNDEFINED
            self._record(LogKind.START_IGNORED, child, incarnation=incarnation)
        elif isinstance(event, StartFailed):
            self._record(LogKind.START_FAILED, child, event.reason, incarnation)
        else:  # pragma: no cover - _check_completion lets only start completions through
            raise SupervisorProtocolError(f"{self.path}: {event!r} answers no StartChild")
        return event

    def _terminate_children(self, group: list[_Child]) -> _Op:
        """OTP's ``terminate_children``: newest first, one at a time; temporary specs go.

        With ``parallel_shutdown`` all at once instead, as OTP's ``simple_one_for_one``."""
        if self.spec.parallel_shutdown:
            yield from self._terminate_all(
                [c for c in reversed(group) if c.status is ChildStatus.RUNNING]
            )
        for child in reversed(group):
            if child.status is ChildStatus.RUNNING:
                yield from self._do_terminate(child)
            if child in self._children:
                self._del_child(child)
        return None

    def _terminate_all(self, running: list[_Child]) -> _Op:
        """Every child of `running` asked to stop at once; done when each has answered."""
        commands = []
        for child in running:
            queued = self._queued_exit(child)
            if queued is not None:
                self._terminated(child, queued.reason)
            else:
                commands.append(TerminateChild(child.id, child.incarnation, child.spec.shutdown))
        pending, new = tuple(commands), True
        while pending:
            event = yield _AwaitAll(pending, new)
            if not isinstance(event, ChildTerminated):  # pragma: no cover - see _check_completion
                raise SupervisorProtocolError(f"{self.path}: {event!r} answers no TerminateChild")
            key = (event.id, event.incarnation)
            pending, new = tuple(c for c in pending if (c.id, c.incarnation) != key), False
            child = next(c for c in running if (c.id, c.incarnation) == key)
            self._terminated(child, event.reason)
        return None

    def _do_terminate(self, child: _Child) -> _Op:
        """OTP's ``shutdown/1``; an exit already in the mailbox is consumed instead (its
        ``unlink_flush``), so that stale exit never triggers a second restart."""
        queued = self._queued_exit(child)
        if queued is not None:
            reason = queued.reason
        else:
            event = yield TerminateChild(child.id, child.incarnation, child.spec.shutdown)
            if not isinstance(event, ChildTerminated):  # pragma: no cover - see _check_completion
                raise SupervisorProtocolError(f"{self.path}: {event!r} answers no TerminateChild")
            reason = event.reason
        self._terminated(child, reason)
        return None

    def _queued_exit(self, child: _Child) -> ChildExited | None:
        """The child's own exit, if it waits in the mailbox: taken out (OTP's ``unlink_flush``)."""
        queued = next(
            (
                m
                for m in self._mailbox
                if isinstance(m, ChildExited)
                and (m.id, m.incarnation) == (child.id, child.incarnation)
            ),
            None,
        )
        if queued is not None:
            self._mailbox.remove(queued)
        return queued

    def _terminated(self, child: _Child, reason: object) -> None:
        child.status = ChildStatus.UNDEFINED
        self._record(LogKind.CHILD_TERMINATED, child, reason)
        if not _expected_shutdown_reason(child.restart, child.spec.shutdown, reason):
            # Reported only: OTP rule 10 (docs/otp-rules.md).
            self._record(LogKind.SHUTDOWN_ERROR, child, reason)

    # ---- dynamic children -------------------------------------------------------------------

    def _handle_start_child(self, request: StartChildRequest) -> _Op:
        """OTP's ``start_child/2`` for a non-simple supervisor (OTP rule 39, docs/otp-rules.md)."""
        try:
            check_sibling(self.spec, request.spec, frozenset())
        except SpecError as error:
            self._reply(request.ref, Outcome.INVALID_SPEC, error)
            return None
        existing = self._find(request.spec.id)
        if existing is not None:
            running = existing.status is ChildStatus.RUNNING
            outcome = Outcome.ALREADY_STARTED if running else Outcome.ALREADY_PRESENT
            self._reply(request.ref, outcome)
            return None
        child = _Child(request.spec)
        event = yield from self._start(child)
        if isinstance(event, ChildStarted):
            self._children.append(child)
            self._reply(request.ref, Outcome.OK)
        elif isinstance(event, StartIgnored):
            if child.restart is not Restart.TEMPORARY:
                self._children.append(child)
            self._reply(request.ref, Outcome.IGNORED)
        elif isinstance(event, StartFailed):
            self._reply(request.ref, Outcome.START_ERROR, event.reason)
        return None

    def _handle_terminate_child(self, request: TerminateChildRequest) -> _Op:
        """Not an exit event: no restart, no intensity, no auto-shutdown.

        OTP rule 40 (docs/otp-rules.md).
        """
        child = self._find(request.id)
        if child is None:
            self._reply(request.ref, Outcome.NOT_FOUND)
            return None
        if child.status is ChildStatus.RUNNING:
            yield from self._do_terminate(child)
        self._del_child(child)
        self._reply(request.ref, Outcome.OK)
        return None

    def _handle_restart_child(self, request: RestartChildRequest) -> _Op:
        """Start a stopped child; not a restart, so intensity is untouched.

        OTP rule 41 (docs/otp-rules.md).
        """
        child = self._find(request.id)
        if child is None or child.status is not ChildStatus.UNDEFINED:
            self._reply(request.ref, _busy_outcome(child))
            return None
        event = yield from self._start(child)
        if isinstance(event, ChildStarted):
            self._reply(request.ref, Outcome.OK)
        elif isinstance(event, StartIgnored):
            self._reply(request.ref, Outcome.IGNORED)
        elif isinstance(event, StartFailed):
            self._reply(request.ref, Outcome.START_ERROR, event.reason)
        return None

    def _handle_delete_child(self, request: DeleteChildRequest) -> None:
        """OTP rule 42 (docs/otp-rules.md): forget a stopped child's spec."""
        child = self._find(request.id)
        if child is None or child.status is not ChildStatus.UNDEFINED:
            self._reply(request.ref, _busy_outcome(child))
            return
        self._children.remove(child)
        self._reply(request.ref, Outcome.OK)

    def _reply(self, ref: object, outcome: Outcome, reason: object = None) -> None:
        self._out.append(Reply(ref, outcome, reason))


def _busy_outcome(child: _Child | None) -> Outcome:
    if child is None:
        return Outcome.NOT_FOUND
    if child.status is ChildStatus.RESTARTING:
        return Outcome.RESTARTING
    return Outcome.RUNNING


def _expected_shutdown_reason(restart: Restart, shutdown: ShutdownSpec, reason: object) -> bool:
    """What OTP's ``shutdown/1`` accepts silently; anything else is a ``shutdown_error`` report.

    A kill after the timeout ran out is reported too, as in OTP.
    """
    if not isinstance(reason, str):
        return restart is not Restart.PERMANENT and is_shutdown_tuple(reason)
    if reason == KILLED:
        return shutdown is Shutdown.BRUTAL_KILL
    if reason == SHUTDOWN and shutdown is not Shutdown.BRUTAL_KILL:
        return True
    return restart is not Restart.PERMANENT and reason in (SHUTDOWN, NORMAL)
