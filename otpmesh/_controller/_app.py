"""Running a supervision tree: ``async with otpmesh.start(tree) as app``.

``App`` is the façade users hold: refs, the event log, ``settled()``, dynamic children. What the
drivers, the runtime and otpmesh.chaos work with is the tree's internal context (_tree.py).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import IO, Literal

import trio
from rich.tree import Tree

from .._core._actor import Actor
from .._core._children import ChildInfo, ChildStatus
from .._core._errors import SupervisorError
from .._core._exits import describe
from .._core._reasons import SHUTDOWN
from .._core._signature import Endpoints
from .._core._spec import Mesh, Supervisor, Worker
from .._core._supevents import Outcome, Stop
from .._node._mesh import ActorMesh, ActorRef, Slot
from .._runtime._controller_runtime import runtime
from .._runtime._proc import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT
from .._runtime._run import stop_watched
from ._driver import SupervisorDriver
from ._events import EventLog
from ._inspect import Stacks, collect, serve_signal, under
from ._owners import owners
from ._pgplacement import with_process_groups
from ._placement import LocalPlacement, ProcsPlacement
from ._takeover import resume
from ._takeoverspec import Resumption, Takeover
from ._tree import TreeContext
from ._view import view
from ._watch import watchable

PlacementName = Literal["procs", "local"]


class App:
    """A running supervision tree: refs to its actors, its event log, dynamic children."""

    def __init__(self, context: TreeContext) -> None:
        self._tree = context

    @property
    def tree(self) -> Supervisor | Mesh:
        """The spec this app was started with."""
        return self._tree.tree

    @property
    def events(self) -> EventLog:
        """Every supervision step, as data (``app.events.of_kind(...)``, ``subscribe()``)."""
        return self._tree.events

    def actor(self, path: str) -> ActorRef:
        """A ref to the worker at `path` ('rl/reward', 'rl/rollouts/2'); valid across restarts."""
        spec = self._tree.spec(path)
        if not isinstance(spec, Worker):
            kind = type(spec).__name__
            raise ValueError(
                f"{path} is a {kind}, not an actor: use app.mesh({path!r})"
                if isinstance(spec, Mesh)
                else f"{path} is a {kind}, not an actor"
            )
        return ActorRef(path, endpoints_of(spec.actor), self._holder(path).slot(path))

    def mesh(self, path: str) -> ActorMesh:
        """The actor mesh of the Mesh spec at `path`, shaped as declared; valid across restarts."""
        spec = self._tree.spec(path)
        if not isinstance(spec, Mesh):
            raise ValueError(f"{path} is a {type(spec).__name__}, not a Mesh: use app.actor()")
        holder = self._holder(path)
        slots = [holder.slot(f"{path}/{rank}") for rank in range(spec.size)]
        return ActorMesh(path, endpoints_of(spec.actor), dict(spec.shape), slots, None)

    def _holder(self, path: str) -> TreeContext:
        """This app's tree, or the tree one of its actors owns, that has `path`."""
        return self._tree.holder(path) or self._tree

    async def settled(self) -> None:
        """Wait until no supervisor has work pending (exits handled, restarts done)."""
        await self._tree.settled()

    @property
    def resumed(self) -> Resumption | None:
        """What this app's start found when it took a running tree over (its epoch, the
        previous controller, actors adopted and lost, the gap); None when it started afresh:
        a driver resuming its loop asks this instead of guessing (docs/guides/takeover.md)."""
        resumption: Resumption | None = self._tree.resumption
        return resumption

    def view(self) -> Tree:
        """The running tree as a rich tree: every supervisor (strategy, intensity), every
        child (status, incarnation), the trees actors own under their owners. A notebook
        shows it as a cell's value; ``rich.print(app.view())`` prints it."""
        return view(self._tree)

    def which_children(self, path: str) -> list[ChildInfo]:
        """OTP's ``which_children``: the children of the running supervisor (or mesh) at `path`,
        newest first, each with its status (running, ``undefined``: not running, or
        restarting), incarnation, type and spec. KeyError if no supervisor runs at `path`."""
        return self._tree.which_children(path)

    def count_children(self, path: str) -> dict[str, int]:
        """OTP's ``count_children``: how many child specs the supervisor at `path` has
        (``specs``), how many of them are running (``active``), and how many are supervisors
        (a ``Supervisor`` or a ``Mesh``) and workers."""
        children = self._tree.which_children(path)
        supervisors = sum(child.type == "supervisor" for child in children)
        return {
            "specs": len(children),
            "active": sum(child.status is ChildStatus.RUNNING for child in children),
            "supervisors": supervisors,
            "workers": len(children) - supervisors,
        }

    async def stacks(self, path: str = "") -> Stacks:
        """What every running actor of this app under `path` (default: all) is doing now:
        'idle', or the endpoint it serves and its frames, innermost first, with the other
        threads of each process; ``str()`` groups actors with identical stacks. Processes are
        asked at once and have 1 s to answer (a stopped one, or one in C code holding the GIL,
        says it did not)."""
        root = self._tree.root.path
        if path and not under(path, root):
            raise ValueError(f"{path!r} is not in this app (its paths are under {root!r})")
        return await collect(await runtime(), path or root)

    async def start_child(self, sup_path: str, spec: Worker | Supervisor | Mesh) -> Outcome:
        """OTP's start_child: add `spec` to the supervisor at `sup_path` and start it."""
        return await self._tree.start_child(sup_path, spec)

    async def terminate_child(self, path: str) -> Outcome:
        """OTP's terminate_child: stop the child at `path`, keep its spec (unless temporary)."""
        return await self._tree.terminate_child(path)

    async def restart_child(self, path: str) -> Outcome:
        """OTP's restart_child: start again a child whose spec is kept but is not running."""
        return await self._tree.restart_child(path)

    async def delete_child(self, path: str) -> Outcome:
        """OTP's delete_child: forget the spec of a child that is not running."""
        return await self._tree.delete_child(path)


def context(app: App) -> TreeContext:
    """The internal state behind `app`: for otpmesh.chaos and otpmesh.testing, not for users."""
    return app._tree


def endpoints_of(actor: type | str) -> Endpoints:
    """What callers of `actor`'s refs check their calls against (nothing, for an import path)."""
    if isinstance(actor, type) and issubclass(actor, Actor):
        return Endpoints.of(actor.endpoints())
    return Endpoints({})  # an import path: the controller need not import it to call it


def start(
    tree: Supervisor | Mesh,
    *,
    placement: PlacementName | ProcsPlacement = "procs",
    events_file: IO[str] | None = None,
    heartbeat_timeout: float | None = None,
    takeover: Takeover | None = None,
) -> AbstractAsyncContextManager[App]:
    """Start a supervision tree; stop it (children in reverse start order) when the block ends.

    ``placement="procs"`` runs every actor in a worker process of its own; ``"local"`` runs them
    all in this process with identical supervision, for fast deterministic tests. If the root
    supervisor gives up, the block is cancelled and ``SupervisorError`` says where and why.
    Trees started in one controller are independent, each with a root id of its own: a start
    whose root id is already running raises ``SupervisorError`` naming it.
    ``heartbeat_timeout`` (seconds; default ``OTPMESH_HEARTBEAT_TIMEOUT``, else 2.0): how long
    a worker process of this app may be silent before the kernel is asked what it is doing; a
    stopped one is then hung, a running one gets ten times as long, and one still starting
    (before its first actor is up) at least 60 s (docs/supervision.md).
    Inside an actor, ``otpmesh.context().start(spec)`` starts a tree that the actor owns.
    ``takeover=otpmesh.Takeover(dir=...)``: the tree outlives this controller for a grace
    period, and a standby takes it over, actors and state (docs/guides/takeover.md).
    """
    if takeover is not None and not isinstance(takeover, Takeover):
        raise TypeError(f"takeover= takes otpmesh.Takeover(dir=..., grace=...), not {takeover!r}")
    if takeover is not None and placement != "procs":
        raise ValueError(
            f"takeover= keeps worker processes alive for a standby: it needs placement='procs', "
            f"not {placement!r}"
        )
    return run_tree(
        tree,
        placement=placement,
        events_file=events_file,
        heartbeat_timeout=heartbeat_timeout,
        takeover=takeover,
    )


@asynccontextmanager
async def run_tree(
    tree: Supervisor | Mesh,
    *,
    placement: PlacementName | ProcsPlacement = "procs",
    events_file: IO[str] | None = None,
    heartbeat_timeout: float | None = None,
    prefix: str | None = None,
    events: EventLog | None = None,
    takeover: Takeover | None = None,
    slots: dict[str, Slot] | None = None,
) -> AsyncIterator[App]:
    """``start``, and for a tree an actor owns (_subtree.py): its paths under `prefix` (the
    owner's path), its entries in `events` (the owner's tree's log), its slots in `slots`
    (its app's registry of owned trees' slots: refs outlive the owner's restarts)."""
    if not isinstance(tree, Supervisor | Mesh):
        raise TypeError(f"otpmesh.start needs a Supervisor or Mesh spec, not {tree!r}")
    if not isinstance(placement, ProcsPlacement) and placement not in ("procs", "local"):
        raise ValueError(f"placement must be 'procs' or 'local', not {placement!r}")
    beat_timeout = _heartbeat_timeout(heartbeat_timeout)
    resumed = await resume(takeover, tree) if takeover is not None else None
    rt = resumed.rt if resumed is not None else await runtime()
    root_path = f"{prefix}/{tree.id}" if prefix else tree.id
    if isinstance(rt.exit_listeners.get(root_path), TreeContext):
        # Its paths would be the running tree's: refused, as OTP's {already_started, Pid}.
        raise SupervisorError(
            f"otpmesh.start: a tree whose root is {root_path!r} is already running in this "
            f"controller; give this one another root id, e.g. Supervisor({tree.id + '2'!r}, ...)",
            ("already_started", root_path),
        )
    log = events if events is not None else EventLog(events_file)
    ctx = TreeContext(tree, log, rt.exit_listeners, prefix or "", slots)
    ctx.owns_events = events is None
    ctx.owners_quiet = owners(rt).quiet
    ctx.runtime_node = rt.node
    if resumed is not None:
        resumed.seed(ctx)
    elif rt.live_journal is not None:  # a tree an actor owns, in an app with a takeover
        ctx.live_journal = rt.live_journal
    try:
        with stop_watched(ctx.waiting_for):  # a slow Ctrl-C names what it waits for
            # listed for otpmesh watch (and otpmesh run file.py:main) while it runs
            async with watchable(ctx), _collapse(), trio.open_nursery() as nursery:
                ctx.nursery = nursery
                if isinstance(placement, ProcsPlacement):  # a proc mesh's own processes
                    ctx.placement = placement
                elif resumed is not None:
                    procs, running = resumed.own()
                    ctx.placement = ProcsPlacement(rt, procs, beat_timeout, running=running)
                elif placement == "procs":
                    ctx.placement = ProcsPlacement(rt, heartbeat_timeout=beat_timeout)
                else:
                    ctx.placement = LocalPlacement(rt, ctx, nursery)
                ctx.placement = with_process_groups(tree, ctx.placement, rt, ctx, nursery)
                root = _as_supervisor(tree)
                journal = ctx.live_journal  # a takeover resumes the root's list, if journalled
                rows = journal.resume(root_path, 1, root.children) if journal else None
                ctx.root = SupervisorDriver(ctx, root, root_path, None, resume=rows)
                nursery.start_soon(ctx.root.run)
                nursery.start_soon(serve_signal, rt)  # otpmesh stacks PID
                await ctx.root.started.wait()
                if resumed is not None and ctx.root.init_failure is None:
                    await resumed.resumed(ctx, beat_timeout)
                elif ctx.root.init_failure is None:  # a tree an actor owns, resumed
                    ctx.reported_lost = ctx.report_lost()
                try:
                    if ctx.root.init_failure is None:
                        with trio.CancelScope() as scope:
                            ctx.body_scope = scope
                            if ctx.root_failure is not None:  # gave up in a takeover's resume
                                scope.cancel()
                            yield App(ctx)
                finally:
                    with trio.CancelScope(shield=True):
                        await _stop_tree(ctx)
                        if prefix is None:  # a top tree: what its actors owned is stopped too
                            await owners(rt).quiet()
                        if resumed is not None:
                            await resumed.stopped()
                    nursery.cancel_scope.cancel()
    finally:
        for path in ctx.specs:
            rt.exit_listeners.pop(path, None)
        ctx.ended.set()
    if ctx.root.init_failure is not None:
        reason = ctx.root.init_failure
        raise SupervisorError(f"supervisor {tree.id} failed to start: {describe(reason)}", reason)
    if ctx.root_failure is not None:
        raise ctx.failure()


@asynccontextmanager
async def _collapse() -> AsyncIterator[None]:
    """Let the body's own exception through as itself, not wrapped in a nursery's group."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def _heartbeat_timeout(value: object) -> float:
    """``heartbeat_timeout=``, checked: None is the default (the environment's, else 2 s)."""
    if value is None:
        return HEARTBEAT_TIMEOUT
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > HEARTBEAT_INTERVAL)
    ):
        raise ValueError(
            f"heartbeat_timeout must be a number of seconds above the heartbeat interval "
            f"({HEARTBEAT_INTERVAL:g} s), not {value!r}; e.g. heartbeat_timeout=5.0, or leave it "
            "out for the default (OTPMESH_HEARTBEAT_TIMEOUT, else 2 s)"
        )
    return float(value)


def _as_supervisor(tree: Supervisor | Mesh) -> Supervisor:
    return tree.as_supervisor() if isinstance(tree, Mesh) else tree


async def _stop_tree(ctx: TreeContext) -> None:
    """Stop the root (children in reverse start order), then the processes, then the log."""
    ctx.stopping = True
    if not ctx.root.exited.is_set():
        ctx.root.post(Stop(SHUTDOWN))
        await ctx.root.exited.wait()
    await ctx.placement.close()
    if ctx.owns_events:
        ctx.events.close()
