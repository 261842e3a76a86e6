"""Exit reasons as plain data, with OTP's vocabulary.

A reason is any value. Three spellings are special, exactly as in OTP: ``"normal"``,
``"shutdown"`` and ``("shutdown", detail)`` are *normal* exits (a transient child is not restarted
after them); ``"killed"`` is what a child that was killed outright exits with. Anything else (a
string, a small dataclass describing an exception, ...) is abnormal. Keeping reasons as data, not
exception objects, lets them cross the wire and be compared in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

NORMAL = "normal"
SHUTDOWN = "shutdown"
KILLED = "killed"
#: What stopping a child yields when that incarnation is not running and left no exit behind
#: (OTP's ``noproc``). Abnormal, like any reason not named above.
NOPROC = "noproc"
#: The tag in the reason ``("shutdown", ("failed_to_start_child", id, reason))``.
FAILED_TO_START_CHILD = "failed_to_start_child"


@dataclass(frozen=True, slots=True)
class Reported:
    """A reason as another process reported it (``otpmesh watch``): its words, and whether OTP
    counts it as normal. It describes itself with its words."""

    text: str
    normal: bool


def is_shutdown_tuple(reason: object) -> bool:
    """True for ``("shutdown", detail)``: OTP's ``{shutdown, Term}``."""
    return isinstance(reason, tuple) and len(reason) == 2 and reason[0] == SHUTDOWN


def is_normal_exit(reason: object) -> bool:
    """True for the reasons OTP treats as normal: 'normal', 'shutdown', ('shutdown', detail).

    ``isinstance`` first, because a reason may be any object (an array's ``==`` is not a bool).
    """
    if isinstance(reason, str):
        return reason in (NORMAL, SHUTDOWN)
    if isinstance(reason, Reported):
        return reason.normal
    return is_shutdown_tuple(reason)


def failed_to_start_child(child_id: str, reason: object) -> tuple[str, tuple[str, str, object]]:
    """The exit reason of a supervisor whose initial start failed at `child_id`.

    OTP rule 6 (docs/otp-rules.md).
    """
    return (SHUTDOWN, (FAILED_TO_START_CHILD, child_id, reason))
