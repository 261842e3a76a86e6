"""The faults a ``SupervisionMachine`` throws: which there are, how each is thrown at the
running app, and the exit reason the reference model is told it causes (which faults a tree and
a placement allow: ``_checks.py``).

The hangs are opt-in (``faults = FAULTS + HANG_FAULTS``) and need real worker processes:

- ``wedge`` (``otpmesh.chaos.wedge``): the actor's next endpoint blocks its thread for ever
  while its process keeps beating; the machine sends that call itself. Only the worker's
  progress deadline ends it: its watchdog reports ``Hung`` (with the stacks, at ``chaos_wedge``)
  and kills the process; the supervisor restarts the actor as after any crash. In-process, the
  endpoint would block the controller's own thread (the MockClock and every supervisor with it),
  and nothing could end it.
- ``hang`` (``otpmesh.chaos.hang``): SIGSTOP of the worker's process; after the app's
  ``heartbeat_timeout`` the runtime finds it stopped and kills it: a ``ProcessExit``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from .. import chaos
from .._controller._app import App
from .._core._errors import ActorDiedError, ActorError, CallTimeoutError, SupervisorError
from .._core._exits import ActorCrash, Hung, ProcessExit
from .._core._reasons import KILLED
from ._appthread import AppThread

#: The faults the machine throws: an exception inside the actor, a clean exit with 'normal' or
#: 'shutdown', and a kill (SIGKILL of its process under placement="procs").
FAULTS: tuple[str, ...] = ("crash", "stop_normal", "stop_shutdown", "kill")

#: Opt-in faults that leave the actor stuck rather than dead (placement="procs" only): a wedged
#: endpoint, ended by the worker's progress deadline, and a SIGSTOPped process, ended by the
#: heartbeat. Add them with ``faults = FAULTS + HANG_FAULTS``.
HANG_FAULTS: tuple[str, ...] = ("wedge", "hang")

#: The errors a call may end with; anything else escaping a call fails the test.
CLEAR_ERRORS = (ActorError, ActorDiedError, CallTimeoutError, SupervisorError)


async def throw(
    app: App,
    runner: AppThread,
    path: str,
    fault: str,
    call: Callable[[str], Awaitable[object]],
) -> chaos.Fault:
    """Throw `fault` at the worker at `path`; `call` calls it (a wedge waits for a call). A
    fault that ends a process returns once that process is gone, so the next step never finds
    it half dead (it may host no actor, when its child exited and was not restarted: then no
    exit shows in the log)."""
    if fault == "crash":
        return await chaos.crash(app, path, "chaos")
    if fault.startswith("stop_"):
        return await chaos.stop(app, path, fault.removeprefix("stop_"))
    if fault == "wedge":
        done = await chaos.wedge(app, path)
        if done.hit:
            # The call that wedges: it ends when the deadline ends the actor, or at its timeout.
            with contextlib.suppress(*CLEAR_ERRORS):
                await call(path)
        return done
    proc = runner.process(path)
    done = await (chaos.kill(app, path) if fault == "kill" else chaos.hang(app, path))
    if proc is not None:
        await proc.exited.wait()
    return done


def model_reason(fault: str, placement: str, call_endpoint: str) -> object:
    """The exit reason the model is told `fault` causes (``reason_key`` compares it)."""
    if fault == "crash":
        return ActorCrash("ChaosCrash", "chaos")
    if fault.startswith("stop_"):
        return fault.removeprefix("stop_")
    if fault == "wedge":
        return Hung(call_endpoint, 0.0, "ran past its progress deadline; its process was killed")
    return ProcessExit(0, f"{fault}: killed") if placement == "procs" else KILLED
