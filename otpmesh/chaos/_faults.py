"""The faults themselves: each takes the running ``App`` and an actor's path, records the fault in
``app.events`` and causes it (``otpmesh.chaos`` re-exports them)."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import trio

from .._controller._app import App, context
from .._controller._placement import LocalPlacement
from .._controller._takeover import current_state, journal_mark
from .._controller._tree import TreeContext
from .._core._errors import TakeoverError
from .._core._exits import ActorCrash
from .._core._reasons import KILLED, NORMAL, SHUTDOWN
from .._core._spec import Mesh, Supervisor
from .._core._supevents import LogEntry, LogKind

log = logging.getLogger("otpmesh.chaos")

#: The faults a ChaosMonkey can throw, by name.
FAULTS = ("crash", "stop", "kill", "hang", "wedge", "partition", "delay", "drop", "fail_start")
#: The kind of a planned controller kill (``FaultPlan``), and the path its entries name.
CONTROLLER = "controller"


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: when (trio time), what, where, and whether it hit a running actor."""

    time: float
    kind: str
    path: str
    detail: str = ""
    hit: bool = True

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        if self.kind == CONTROLLER:
            return f"kill the controller{detail}"
        return f"{self.kind} {self.path}{detail}" + ("" if self.hit else " [missed: not running]")


def _tree(app: App, path: str) -> TreeContext:
    """The tree that has `path`: the app's own, or one that an actor of it owns."""
    return context(app).holder(path) or context(app)


def record(app: App, kind: str, path: str, detail: str = "", hit: bool = True) -> Fault:
    fault = Fault(trio.current_time(), kind, path, detail, hit)
    sup, _, child = path.rpartition("/")
    app.events.append(LogEntry(fault.time, LogKind.FAULT_INJECTED, sup, child, None, str(fault)))
    return fault


async def _inject(app: App, kind: str, path: str, detail: str, fault: str, reason: object) -> Fault:
    """Log the fault, then cause it: its entry comes before the exit it causes."""
    recorded = record(app, kind, path, detail)
    tree = _tree(app, path)
    if await tree.placement.inject(tree.slot(path), fault, reason):
        return recorded
    return record(app, kind, path, detail, hit=False)


def _slot(app: App, path: str):  # type: ignore[no-untyped-def]
    app.actor(path)  # validates: a worker path of this tree
    return _tree(app, path).slot(path)


async def crash(app: App, path: str, reason: str = "chaos") -> Fault:
    """Crash the actor at once, as if an exception (``ChaosCrash``) were raised inside it."""
    _slot(app, path)
    return await _inject(app, "crash", path, reason, "crash", ActorCrash("ChaosCrash", reason))


async def stop(app: App, path: str, reason: object = NORMAL) -> Fault:
    """Make the actor exit with `reason` ('normal', 'shutdown', ('shutdown', detail), ...) after
    its current message, as if it had called ``self.stop(reason)``.

    At a supervisor's (or a mesh's) path it forces a stop on the supervisor, as its parent's
    terminate would but with `reason` (in OTP, what a supervisor does when its parent sends it
    an exit signal): it terminates its children in its shutdown order and exits with `reason`,
    and its parent applies its strategy (a permanent child supervisor is restarted, static
    children only). At the root it ends the app: with an abnormal reason ``otpmesh.start``
    raises ``SupervisorError``, with 'normal' or 'shutdown' the block just ends."""
    tree = _tree(app, path)
    if isinstance(tree.specs.get(path), Supervisor | Mesh):
        recorded = record(app, "stop", path, repr(reason))
        if tree.exit_supervisor(path, reason):
            return recorded
        return record(app, "stop", path, "not running", hit=False)
    _slot(app, path)
    return await _inject(app, "stop", path, repr(reason), "exit", reason)


async def kill(app: App, path: str) -> Fault:
    """SIGKILL the actor's worker process (in-process placement: kill the actor itself).

    At a supervisor's (or a mesh's) path it is OTP's ``exit(Sup, kill)``: every actor under
    it is killed at once (brutal: no orderly stop, no ``on_stop``), the supervisor exits with
    ``killed``, and its parent applies its strategy. At the root it ends the app with
    ``SupervisorError``."""
    tree = _tree(app, path)
    if isinstance(tree.specs.get(path), Supervisor | Mesh):
        recorded = record(app, "kill", path, "the supervisor and everything under it")
        if await tree.kill_supervisor(path):
            return recorded
        return record(app, "kill", path, "not running", hit=False)
    slot = _slot(app, path)
    proc = tree.placement.process(slot)
    if proc is None and isinstance(tree.placement, LocalPlacement):
        return await _inject(app, "kill", path, "in-process", "kill", KILLED)
    if proc is None:  # its process is gone already (it is restarting)
        return record(app, "kill", path, "no process", hit=False)
    incarnation = proc.actors.get(path)
    fault = record(app, "kill", path, f"SIGKILL pid {proc.pid}", hit=incarnation is not None)
    if incarnation is not None:
        tree.actor_exiting(path, incarnation)  # settled() now waits for this exit and its restart
    os.kill(proc.pid, signal.SIGKILL)
    return fault


async def hang(app: App, path: str) -> Fault:
    """SIGSTOP the actor's process: calls to it time out, its heartbeats stop, and the runtime
    kills and replaces it (``OTPMESH_HEARTBEAT_TIMEOUT``, 2 s by default)."""
    slot = _slot(app, path)
    proc = _tree(app, path).placement.process(slot)
    if proc is None:
        return record(app, "hang", path, "needs placement='procs'", hit=False)
    os.kill(proc.pid, signal.SIGSTOP)
    return record(app, "hang", path, f"SIGSTOP pid {proc.pid}")


async def wedge(app: App, path: str, seconds: float | None = None) -> Fault:
    """Wedge the actor's next endpoint call: it blocks its thread (in ``chaos_wedge``, which its
    stack shows) for `seconds`, or for ever, as a wedged engine does, while its process stays
    alive and beating. Only a progress deadline (``progress_deadline`` in its spec or endpoint)
    gets it out: use it to test yours. In ``placement="local"`` the controller itself blocks."""
    if seconds is not None and not (isinstance(seconds, int | float) and seconds > 0):
        raise ValueError(f"wedge seconds must be positive or None, not {seconds!r}")
    detail = "for ever" if seconds is None else f"for {seconds:g} s"
    return await _inject(app, "wedge", path, detail, "wedge", seconds)


async def partition(app: App, path: str, seconds: float) -> Fault:
    """Cut the actor's process off for `seconds`: every call, cast and reply it sends or receives
    is lost (calls to it time out: give them a timeout). Supervision's own messages and the
    heartbeats still flow, so the process is not replaced and its exits are not lost."""
    return await _link_fault(app, path, "partition", seconds, delay=0.0)


async def delay(app: App, path: str, latency: float, seconds: float) -> Fault:
    """For `seconds`, messages from the controller to the actor arrive `latency` s late."""
    return await _link_fault(app, path, "delay", seconds, delay=latency)


async def drop(app: App, path: str, seconds: float) -> Fault:
    """For `seconds`, messages from the controller to the actor are lost."""
    return await _link_fault(app, path, "drop", seconds, delay=math.inf)


async def _link_fault(app: App, path: str, kind: str, seconds: float, delay: float) -> Fault:
    slot = _slot(app, path)
    tree = _tree(app, path)
    node = tree.runtime_node
    if kind == "partition":
        proc = tree.placement.process(slot)
        if proc is None or proc.conn is None:
            return record(app, kind, path, "needs placement='procs'", hit=False)
        node.sys_cast(proc.conn, "partition", {"seconds": seconds})
        return record(app, kind, path, f"{seconds:g} s")
    if not slot.addr:
        return record(app, kind, path, "not running", hit=False)
    node.faults.add(slot.addr, delay, seconds)
    detail = f"{seconds:g} s" if kind == "drop" else f"+{delay * 1e3:g} ms for {seconds:g} s"
    return record(app, kind, path, detail)


def fail_starts(app: App, path: str, count: int = 1) -> Fault:
    """Make the next `count` starts of the actor at `path` fail (a ``ChaosStartFailure``)."""
    app.actor(path)
    _tree(app, path).fail_next_starts(path, count)
    return record(app, "fail_start", path, f"next {count}")


def takeover_of(app: App, what: str):  # type: ignore[no-untyped-def]
    """The app's takeover state; a TakeoverError that says how to get one if it has none."""
    context(app)  # validates: a running app
    state = current_state()
    if state is None:
        raise TakeoverError(
            f"{what} SIGKILLs this controller, and this app runs without a takeover: nothing "
            "would take the tree over (its workers exit with their controller). Start it with "
            "otpmesh.start(tree, takeover=otpmesh.Takeover(dir=...)) and run a standby beside "
            "it (docs/guides/takeover.md), or leave controller kills out of the plan"
        )
    return state


async def kill_controller(app: App, mark: Mapping[str, object] | None = None) -> NoReturn:
    """SIGKILL this controller (the process running `app`), as an OOM kill or a bug would: it
    does not return. The app must run with a takeover (``otpmesh.start(tree,
    takeover=Takeover(...))``), else ``TakeoverError``: its workers then wait out the grace
    period and a standby takes the tree over. The kill is journalled first (fsync'd, with
    `mark`), where a ``FaultPlan`` on the standby finds it."""
    state = takeover_of(app, "chaos.kill_controller")
    fault = record(app, CONTROLLER, CONTROLLER, f"SIGKILL pid {os.getpid()}")  # for the log
    log.warning("chaos: %s", fault)
    journal_mark(state, {"chaos": CONTROLLER, "pid": os.getpid(), **(mark or {})})
    sys.stdout.flush()  # what this controller printed is not lost with it
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    await trio.sleep_forever()  # not reached: SIGKILL is not deferred


async def throw(app: App, kind: str, path: str, seconds: float, why: str) -> Fault:
    """Throw one fault of `kind` (a name in FAULTS) at `path`; `seconds` for the timed ones."""
    try:
        if kind == "crash":
            return await crash(app, path, why)
        if kind == "stop":
            return await stop(app, path, SHUTDOWN)
        if kind == "kill":
            return await kill(app, path)
        if kind == "hang":
            return await hang(app, path)
        if kind == "wedge":
            return await wedge(app, path, seconds)
        if kind == "partition":
            return await partition(app, path, seconds)
        if kind == "delay":
            return await delay(app, path, 0.05, seconds)
        if kind == "drop":
            return await drop(app, path, seconds)
        return fail_starts(app, path, 1)
    except (ProcessLookupError, KeyError) as exc:
        return record(app, kind, path, str(exc), hit=False)
