"""How actors end, in OTP's vocabulary, as data that crosses the wire.

An actor's exit reason is one of:

- ``"normal"`` / ``"shutdown"`` / ``("shutdown", detail)``: it stopped (``self.stop(reason)``,
  or its supervisor stopped it); OTP calls these normal exits;
- ``"killed"``: it was killed outright (``BRUTAL_KILL``, or its shutdown timeout ran out);
- an ``ActorCrash``: an exception escaped an endpoint, ``on_start`` or ``on_stop`` (any
  BaseException the actor's code raised: ``ended_by`` says which reason it gives);
- a ``ProcessExit``: its worker process died (SIGKILL, segfault, OOM, ...);
- a ``Hung``: it made no progress in time (an endpoint ran past its progress deadline, or its
  process stopped answering), with the stacks of its threads when that was found.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._reasons import FAILED_TO_START_CHILD, KILLED, NORMAL, Reported, is_normal_exit


class Ignore(Exception):
    """Raise from an actor's constructor or ``on_start`` to return OTP's ``ignore``: the child is
    not started, and its supervisor keeps its spec (a temporary child's spec is dropped)."""


@dataclass(frozen=True, slots=True)
class ActorCrash:
    """An exception escaped the actor: its type name, message and traceback text, and the
    endpoint it escaped from (empty when it came from elsewhere: ``on_start``, chaos)."""

    type_name: str
    message: str
    traceback: str = ""
    endpoint: str = ""

    def __str__(self) -> str:
        return f"crashed with {self.type_name}: {self.message}"

    @classmethod
    def of(cls, exc: BaseException, *, skip_frames: int = 0, endpoint: str = "") -> ActorCrash:
        """Describe `exc`; `skip_frames` drops otpmesh's own calling frames from the traceback."""
        import traceback

        tb = exc.__traceback__
        for _ in range(skip_frames):
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        return cls(type(exc).__qualname__, str(exc), text, endpoint)


def ended_by(exc: BaseException, *, skip_frames: int = 0, endpoint: str = "") -> object:
    """The exit reason of an actor whose own code raised `exc` (in an endpoint): as a process
    ends, ``sys.exit()`` and ``sys.exit(0)`` stop it normally (``"normal"``); anything else,
    ``SystemExit`` with another code included, is a crash carrying the exception."""
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return NORMAL
    return ActorCrash.of(exc, skip_frames=skip_frames, endpoint=endpoint)


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """The actor's worker process died: e.g. 'killed by signal 9 (SIGKILL)'."""

    pid: int
    how: str

    def __str__(self) -> str:
        return f"its process (pid {self.pid}) {self.how}"


@dataclass(frozen=True, slots=True)
class Hung:
    """The actor was stuck: `endpoint` (empty when the whole process was) made no progress for
    `seconds`; `how` says what was done about it; `stacks` is where its threads were then."""

    endpoint: str
    seconds: float
    how: str
    stacks: str = ""

    def __str__(self) -> str:
        where = f" in {self.endpoint}" if self.endpoint else ""
        innermost = innermost_frame(self.stacks)
        at = f", at {innermost}" if innermost else ""
        return f"hung{where}: no progress for {self.seconds:g} s ({self.how}){at}"


def innermost_frame(stacks: str) -> str:
    """The innermost frame of the first thread in a stacks text (formatted by _stacks.py):
    'func (file:line)', or ''."""
    for line in stacks.splitlines():
        line = line.strip()
        if line.startswith("at "):
            return line[3:]
    return ""


def describe(reason: object) -> str:
    """A reason in words, for error messages and logs."""
    if isinstance(reason, ActorCrash | ProcessExit | Hung):
        return str(reason)
    if isinstance(reason, Reported):
        return reason.text
    if (
        isinstance(reason, tuple)
        and len(reason) == 2
        and isinstance(reason[1], tuple)
        and len(reason[1]) == 3
        and reason[1][0] == FAILED_TO_START_CHILD
    ):
        _, (_, child, why) = reason
        return f"child {child} failed to start ({describe(why)})"
    if reason == KILLED:
        return "killed"  # the reason is its own description
    if is_normal_exit(reason):
        return f"stopped ({reason!r})" if not isinstance(reason, str) else f"stopped ({reason})"
    return f"exited with {reason!r}"
