"""The trio driver around one supervisor core: thin on purpose.

It feeds the core events (from its channel), carries out the core's commands (starting and
stopping children through the placement, or running child supervisors as drivers of their own)
and reports back completions. Everything OTP decides — what to restart, in which order, when to
give up — is the core's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from .._core._children import ChildInfo, ChildStatus
from .._core._exits import ActorCrash, ProcessExit, describe
from .._core._healspec import PEER
from .._core._reasons import KILLED, SHUTDOWN
from .._core._shape import all_coords
from .._core._spec import Mesh, Shutdown, Supervisor, Worker
from .._core._supervisor import SupervisorCore
from .._core._supevents import (
    ChildExited,
    ChildLost,
    ChildStarted,
    ChildTerminated,
    Command,
    Event,
    Exit,
    InitDone,
    InitFailed,
    Reply,
    StartChild,
    StartFailed,
    StartIgnored,
    Stop,
    TerminateChild,
)
from .._node._host import STARTED
from ._healpeers import PeerChoice
from ._placement import ADOPTED, SlotInfo, StartError

if TYPE_CHECKING:
    from ._drivercontext import DriverContext


class SupervisorDriver:
    """Runs one supervisor core as a trio task of the application."""

    def __init__(
        self,
        app: DriverContext,
        spec: Supervisor,
        path: str,
        parent: SupervisorDriver | None,
        incarnation: int = 1,
        resume: list[ChildInfo] | None = None,
    ) -> None:
        self.app = app
        self.spec = spec
        self.path = path
        self.parent = parent
        self.incarnation = incarnation
        if resume is not None and app.live_journal is not None:
            app.incarnations(path).update(app.live_journal.given(path))
        for child in resume or ():
            if not any(child.spec is declared for declared in spec.children):
                app.learn(path, child.spec)  # start_child added it
        self.core = SupervisorCore(
            spec,
            path=path,
            incarnations=app.incarnations(path),
            restarts=app.restart_history(path),
            resume=resume,
        )
        self._send, self._receive = trio.open_memory_channel[Event](math.inf)
        self.children: dict[str, SupervisorDriver] = {}
        self.started = trio.Event()
        self.init_failure: object = None
        self.exited = trio.Event()
        self.exit_reason: object = None
        self.mesh_shape = app.mesh_shapes.get(path)
        self.heal = app.mesh_heals.get(path)  # Mesh(heal=...): restarted actors heal from a peer
        self._peers = PeerChoice()
        self._scope = trio.CancelScope()  # cancelled when the supervisor is killed
        self._dying = False  # killed: it hears nothing more

    # ---------------------------------------------------------------- the loop

    def post(self, event: Event) -> None:
        """Queue an event for the core (from any task, synchronously)."""
        if self.exited.is_set() or self._dying:
            return
        if isinstance(event, ChildExited):
            self._peers.exited()
        self.app.work_started()
        self._send.send_nowait(event)

    async def run(self) -> None:
        try:
            with self._scope:
                await self._run()
        finally:
            if not self.exited.is_set():  # cancelled from outside: nobody else will say so
                self.exit_reason = KILLED
                self.exited.set()

    async def _run(self) -> None:
        if self.mesh_shape is not None:
            await self._prepare_mesh()
        self._apply(self.core.start(trio.current_time()))
        while not self.core.done:
            event = await self._receive.receive()
            try:
                before = self.core.restarts
                self._apply(self.core.handle(event, trio.current_time()))
                if self.core.restarts is not before and self.core.restarts:
                    self.app.restarted(self.path, self.core.restarts)
            finally:
                self.app.work_done()
        self._sync_slots()

    async def _prepare_mesh(self) -> None:
        infos = [self._slot_info(c.id) for c in self.spec.children]
        paths = [f"{self.path}/{c.id}" for c in self.spec.children]
        try:
            await self.app.placement.prepare(paths, infos)
        except Exception:  # each start then reports its own failure through the core
            pass

    def _apply(self, commands: list[Command]) -> None:
        for entry in self.core.take_log():
            self.app.events.append(entry)
        for command in commands:
            if isinstance(command, StartChild):
                self._spawn(self._start_child, command)
            elif isinstance(command, TerminateChild):
                self._spawn(self._terminate_child, command)
            elif isinstance(command, InitDone):
                self.started.set()
            elif isinstance(command, InitFailed):
                self.init_failure = command.reason
                self._finish(command.reason)
                self.started.set()
            elif isinstance(command, Exit):
                self._finish(command.reason)
            elif isinstance(command, Reply):
                self.app.reply(command)
        journal = self.app.live_journal
        if journal is not None and self.core.idle:  # an operation ended: its changes
            changes = self.core.take_changes()
            if changes is not None:
                journal.changed(self.path, self.incarnation, changes, self.spec.children)
        self._sync_slots()

    def _spawn(self, fn: Any, command: StartChild | TerminateChild) -> None:
        self.app.work_started()
        self.app.nursery.start_soon(fn, command)

    def _finish(self, reason: object) -> None:
        self.exit_reason = reason
        self.exited.set()
        if self.parent is not None and self.started.is_set():
            self.parent.post(ChildExited(self.spec.id, self.incarnation, reason))
        elif self.parent is None:
            self.app.root_exited(reason)

    # ---------------------------------------------------------------- commands

    async def _start_child(self, command: StartChild) -> None:
        try:
            self.post(await self._start(command))
        finally:
            self.app.work_done()

    async def _start(self, command: StartChild) -> Event:
        if command.adopt:
            return await self._adopt(command)
        path = f"{self.path}/{command.id}"
        spec = command.spec
        if isinstance(spec, Mesh):
            spec = spec.as_supervisor()
        if isinstance(spec, Supervisor):
            child = SupervisorDriver(self.app, spec, path, self, command.incarnation)
            self.children[command.id] = child
            self.app.nursery.start_soon(child.run)
            await child.started.wait()
            if child.init_failure is not None:
                return StartFailed(command.id, child.init_failure)
            return ChildStarted(command.id)
        slot = self.app.slot(path)
        injected = self.app.injected_start_failure(path)
        if injected is not None:
            return StartFailed(command.id, injected)
        info = replace(
            self._slot_info(command.id),
            progress_deadline=spec.progress_deadline,
            start_timeout=spec.start_timeout,
            heal=self._heal_plan(command),
        )
        try:
            result = await self.app.placement.start(
                slot, command.incarnation, spec.actor, spec.args, spec.kwargs, info
            )
        except StartError as exc:
            return StartFailed(command.id, exc.reason)
        if result not in (STARTED, ADOPTED):
            return StartIgnored(command.id)
        self.app.watch(path, self)
        self._peers.started(command.id)
        return ChildStarted(command.id, adopted=result == ADOPTED)

    async def _adopt(self, command: StartChild) -> Event:
        """A takeover's resume of a child the journal has running: a supervisor resumes its
        own child list; an actor still running as that incarnation in an adopted process is
        taken over, state and all; anything else is lost, and its exit is reported once the
        whole tree is resumed (``app.report_lost``), for OTP's rules to decide."""
        path = f"{self.path}/{command.id}"
        spec = command.spec
        if isinstance(spec, Mesh):
            spec = spec.as_supervisor()
        if isinstance(spec, Supervisor):
            journal = self.app.live_journal
            rows = journal.resume(path, command.incarnation, spec.children) if journal else None
            child = SupervisorDriver(self.app, spec, path, self, command.incarnation, rows)
            self.children[command.id] = child
            self.app.nursery.start_soon(child.run)
            await child.started.wait()
            if child.init_failure is not None:  # no list journalled: it started afresh
                return self._lost(command, child.init_failure)
            return ChildStarted(command.id, adopted=True)
        adopted = getattr(self.app.placement, "adopted", None)
        proc = adopted(path) if adopted is not None else None
        if proc is None or proc.actors.get(path) != command.incarnation:
            live = self.app.placement.process(self.app.slot(path))
            if live is not None:  # its actor ended (a hang, a crash), its process lives on
                why = "it ended while no controller ran; its process lives on"
                return self._lost(command, ActorCrash("ActorLost", why))
            journal = self.app.live_journal
            pid = journal.pid_of(path) if journal else 0
            return self._lost(command, ProcessExit(pid, "ended while no controller ran"))
        return await self._start(replace(command, adopt=False))

    def _lost(self, command: StartChild, reason: object) -> ChildLost:
        self.app.lost(self, command.id, command.incarnation, reason)
        return ChildLost(command.id, reason)

    def _heal_plan(self, command: StartChild) -> dict[str, Any] | None:
        """What a restarted actor of a healing mesh is told: the peers to ask for its state, in
        order (path and address of each one up now), and the fallback (_node/_heal.py)."""
        if self.heal is None or command.incarnation <= 1:  # a first start: nothing to heal
            return None
        peers: list[str] = []
        for source in self.heal.from_:
            if source == PEER:
                running = [
                    c.id for c in self.core.which_children() if c.status is ChildStatus.RUNNING
                ]
                peers += [f"{self.path}/{p}" for p in self._peers.peers(command.id, running)]
            else:  # another replica group: its member of the same rank holds the same shard
                peers.append(f"{source}/{command.id}")
        up = [self.app.slot(p) for p in peers if self.app.has_slot(p)]
        return {
            "peers": [[s.actor_id, s.addr] for s in up if s.up and s.gone is None],
            "fallback": self.heal.fallback,
            "timeout": self.heal.timeout,
        }

    async def _terminate_child(self, command: TerminateChild) -> None:
        try:
            reason = await self._terminate(command)
            self.post(ChildTerminated(command.id, command.incarnation, reason))
        finally:
            self.app.work_done()

    async def _terminate(self, command: TerminateChild) -> object:
        child = self.children.get(command.id)
        if child is not None and child.incarnation == command.incarnation:
            child.post(Stop(SHUTDOWN))
            if command.shutdown is Shutdown.INFINITY or command.shutdown is Shutdown.BRUTAL_KILL:
                await child.exited.wait()
                return child.exit_reason
            with trio.move_on_after(float(command.shutdown)):
                await child.exited.wait()
                return child.exit_reason
            await child.kill(report=False)  # the answer to this TerminateChild says it
            return KILLED
        path = f"{self.path}/{command.id}"
        slot = self.app.slot(path)
        slot.mark_down()
        self.app.stop_begun(path)
        try:
            return await self.app.placement.stop(slot, command.incarnation, command.shutdown)
        finally:
            self.app.stop_ended(path)

    async def kill(self, *, report: bool = True) -> None:
        """OTP's ``exit(Sup, kill)``: this supervisor and everything under it end at once, no
        orderly stop: every supervisor of the subtree stops deciding, every actor of it is
        killed (``BRUTAL_KILL``, all together), and once they are gone the supervisor exits with
        ``killed``, which its parent handles as any child exit (unless `report` is False: a
        TerminateChild whose shutdown ran out answers for it)."""
        drivers = self._subtree()
        workers: list[tuple[str, int]] = []
        for driver in drivers:
            driver._dying = True
            driver._scope.cancel()
            for info in [] if driver.core.done else driver.core.which_children():
                if info.status is ChildStatus.RUNNING and isinstance(info.spec, Worker):
                    workers.append((f"{driver.path}/{info.id}", info.incarnation))
        async with trio.open_nursery() as nursery:
            for path, incarnation in workers:
                nursery.start_soon(self._kill_actor, path, incarnation)
        for driver in reversed(drivers):  # the deepest first, this one last
            for _, slot in self.app.slots_under(driver.path):
                slot.mark_gone(f"its supervisor {self.path} was killed")
            driver._forget_queued()
            if driver is not self or not report or not self.started.is_set():
                driver._killed()  # a start under way fails with 'killed'
        if report and self.started.is_set():
            self._finish(KILLED)

    def _subtree(self) -> list[SupervisorDriver]:
        """This driver and every running one under it, parents first."""
        found, stack = [], [self]
        while stack:
            driver = stack.pop()
            if not driver.exited.is_set():
                found.append(driver)
                stack.extend(driver.children.values())
        return found

    async def _kill_actor(self, path: str, incarnation: int) -> None:
        slot = self.app.slot(path)
        slot.mark_down()
        await self.app.placement.stop(slot, incarnation, Shutdown.BRUTAL_KILL)

    def _forget_queued(self) -> None:
        """Events queued for a core that will never handle them: no longer pending work."""
        while True:
            try:
                self._receive.receive_nowait()
            except trio.WouldBlock:
                return
            self.app.work_done()

    def _killed(self) -> None:
        """Gone without a word to its parent (its parent is being killed too)."""
        self.exit_reason = KILLED
        if not self.started.is_set():  # a start under way fails: whoever waits for it goes on
            self.init_failure = KILLED
            self.started.set()
        self.exited.set()

    # ---------------------------------------------------------------- slots

    def _slot_info(self, child_id: str) -> SlotInfo:
        if self.mesh_shape is None:
            return SlotInfo(f"{self.path}/{child_id}", 0, {}, {})
        rank = int(child_id)
        return SlotInfo(self.path, rank, all_coords(self.mesh_shape)[rank], dict(self.mesh_shape))

    def _sync_slots(self) -> None:
        """Tell callers which actors will come back: a child the core will not start again is
        gone (calls fail fast); one it is restarting is down (calls wait)."""
        if not (self.core.idle or self.core.done):
            return
        statuses = {c.id: c for c in self.core.which_children()} if not self.core.done else {}
        for child_id, slot in self.app.slots_under(self.path):
            info = statuses.get(child_id)
            if info is None or info.status is ChildStatus.UNDEFINED:
                slot.mark_gone(self._why_gone(child_id))
            elif info.status is ChildStatus.RESTARTING:
                slot.mark_down()

    def _why_gone(self, child_id: str) -> str:
        if self.core.done:
            return f"its supervisor {self.path} exited ({describe(self.exit_reason)})"
        last = self.app.last_exit(self.path, child_id)
        if last is None:
            return "it is not running (not started)"
        return f"it is not running and will not be restarted (last exit: {describe(last)})"
