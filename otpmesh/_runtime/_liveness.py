"""Telling a stuck worker from a starved one, when its heartbeats stop.

A worker beats from a thread of its own. Silence alone does not make it hung: on a loaded
machine a runnable process can wait seconds for a CPU (or hold the GIL in C while it imports a
module), and killing it then would turn load into failures. So the kernel is asked what the
silent process is doing (``/proc/PID/stat``):

- stopped (``T``, ``t``: SIGSTOP, a debugger) -> hung, at the heartbeat timeout;
- gone (``Z``, ``X``, no such process) -> not our call: its exit is on its way;
- running, runnable or sleeping -> starved or busy: wait, up to ``HARD_FACTOR`` times the
  timeout of silence, then hung (wedged: no beat from a live process for that long);
- the same, but before it answered its first spawn (importing the actor's module, running its
  constructor, maybe beside a thousand others starting at once) -> its start has its own
  deadline, ``START_SILENCE``, not the heartbeat's: starting is when a loaded machine starves
  processes longest (63 of 1,000 workers starting at once at load 700 were killed as hung).

Pure functions over the state and the silence; ``_workerpipes.watch_heartbeat`` does the I/O.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from .._wire._unproven import stat_fields

#: A live, not stopped process is declared hung after this many heartbeat timeouts of silence.
HARD_FACTOR = 10.0
#: A live, not stopped process that has not answered its first spawn yet is declared hung after
#: this much silence (or HARD_FACTOR timeouts, if longer): the deadline of its start.
START_SILENCE = 60.0


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of process `pid` (R, S, D, T, t, Z, X, ...), or None."""
    fields = stat_fields(pid)
    return fields[0].decode() if fields else None


def describe_status(status: int) -> str:
    """A waitpid status in words: 'exited with code 1', 'killed by signal 9 (SIGKILL)'."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


def zombie_status(pid: int, parent: int | None) -> int | None:
    """The wait status of `pid` if it already exited and `parent` has not reaped it yet (a
    zombie: its pid cannot be reused meanwhile), from ``/proc/PID/stat``; None otherwise.
    A worker's exit is known from this the moment its connection closes, without waiting for
    its fork server to wake up, reap it and report (which a busy machine can delay)."""
    fields = stat_fields(pid) if parent is not None else None
    # From the state (field 3) on: ppid is field 4, exit_code (the wait status) field 52.
    if fields is None or len(fields) < 50 or fields[0] != b"Z" or int(fields[1]) != parent:
        return None
    return int(fields[49])


#: `dying_status` of a process that is alive and not exiting (its lock word was forged).
NOT_EXITING = -1
#: The task flag the kernel sets as a process starts to exit (``exit_signals`` in ``do_exit``),
#: before it records its exit code and long before its robust locks are released.
_PF_EXITING = 0x4


def dying_status(pid: int, parent: int | None) -> int | None:
    """The wait status process `pid` (a child of `parent`, not reaped) is exiting with, from
    ``/proc/PID/stat``: the kernel sets its flags' PF_EXITING (field 9) and then its exit_code
    (field 52) in ``do_exit``, before it tears the memory down, so both are there when the
    process's death lock is released (_deathlock.py), long before it is a zombie.
    NOT_EXITING when it is alive and not exiting (a forged lock word, or an ``exec``). None when
    it is dead or exiting but its status cannot be read here: reaped already (its fork server's
    report carries the status), or exiting with a status that reads 0 (an exit with code 0, or
    a status not ours to read: a non-dumpable process shows 0)."""
    fields = stat_fields(pid) if parent is not None else None
    if fields is None or len(fields) < 50 or int(fields[1]) != parent:
        return None  # gone, or its pid is another's now: it was reaped
    if not int(fields[6]) & _PF_EXITING:
        return NOT_EXITING
    return int(fields[49]) or None


def verdict(
    state: str | None, silent_for: float, timeout: float, started: bool = True
) -> str | None:
    """Why a process silent for `silent_for` s (heartbeat timeout `timeout`) is hung, in words;
    None: keep waiting (it is starved, busy, or already gone). One not `started` (it has not
    answered its first spawn) is given START_SILENCE when it is running; stopped, it is hung
    all the same."""
    if state is None or state in ("Z", "X", "x"):
        return None
    if state in ("T", "t"):
        return f"hung (stopped: no heartbeat for {timeout:g} s)"
    if started and silent_for >= HARD_FACTOR * timeout:
        return f"hung (running, but no heartbeat for {HARD_FACTOR * timeout:g} s)"
    limit = max(START_SILENCE, HARD_FACTOR * timeout)
    if not started and silent_for >= limit:
        return f"hung (starting, but no heartbeat for {limit:g} s)"
    return None


def pending_beats(fd: int, feed: Callable[[bytes], None]) -> bool:
    """Whether beats are waiting unread in the pipe (the watcher itself was late, not the
    worker); reads them and hands them to `feed`."""
    try:
        data = os.read(fd, 1 << 16)
    except (BlockingIOError, OSError):
        return False
    feed(data)
    return bool(data)
