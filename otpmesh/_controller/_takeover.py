"""``otpmesh.start(tree, takeover=Takeover(dir=...))``: a tree that outlives its controller.

The controller that holds the lease in the state directory is the active one; a second copy of
the program started with ``Takeover(..., standby=True)`` waits for the lease, which the kernel
releases when the active controller dies. Whoever takes the lease bumps the fencing epoch and,
when the journal shows a run that did not stop in order, takes its processes over
(_runtime/_adoption.py): the fork server and every live worker accept it only with the app's
secret and the higher epoch. Each supervisor then resumes its child list as the journal kept it
(_livejournal.py): what still runs is adopted, with its incarnation and its state, what died in
the gap exits once the whole tree is resumed, and OTP's rules decide what happens to it, child
by child. docs/guides/takeover.md tells the story.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._core._errors import StandbyDoneError, TakeoverError
from .._core._livetree import LiveTree
from .._core._spec import Mesh, Supervisor
from .._core._supevents import LogEntry, LogKind
from .._runtime._adoption import adopt
from .._runtime._appkey import takeover_key, unwrap
from .._runtime._controller_runtime import _RUNTIME, Runtime, runtime
from .._runtime._journal import Journal, read_journal
from .._runtime._journalstate import Stamp
from .._runtime._lease import Lease
from .._runtime._proc import Proc
from .._runtime._run import run_is_standby
from .._runtime._statedir import JOURNAL, TakeoverState, boot_id, bump_epoch, open_state_dir
from ._fingerprint import differences, fingerprint
from ._lastrun import last_run
from ._livejournal import LiveJournal
from ._ownedover import SINGLETONS, owned_by, resume_owned
from ._standbywait import wait_for_lease
from ._takeoverspec import Hosts, Resumption, Takeover

if TYPE_CHECKING:
    from ._tree import TreeContext

log = logging.getLogger("otpmesh.takeover")


@dataclass(eq=False)
class Resumed:
    """What a start with a takeover found: its runtime, its lease, and what it adopted."""

    rt: Runtime
    lease: Lease
    #: Actor path -> the adopted process it runs in (alive when adopted).
    procs: dict[str, Proc] = field(default_factory=dict)
    #: Actor path -> the incarnation running now in an adopted process.
    running: dict[str, int] = field(default_factory=dict)
    #: Actor path -> the last incarnation the journal saw started.
    journalled: dict[str, int] = field(default_factory=dict)
    #: Supervisor path -> the times of its restarts the journal saw.
    restarts: dict[str, list[Stamp]] = field(default_factory=dict)
    #: Each supervisor's child list, as the journal kept it.
    live: LiveTree | None = None
    #: Actor path -> the pid of the process the journal saw it start in.
    pids: dict[str, int] = field(default_factory=dict)
    #: The trees that actors owned, running, in the order they were started.
    owned: list[dict[str, Any]] = field(default_factory=list)
    #: Every actor the adopted processes said they run (path -> incarnation), journalled or
    #: not (an actor mesh spawned on a proc mesh is not).
    found: dict[str, int] = field(default_factory=dict)
    hosts: Hosts | None = None
    #: The boot of the host the journal's monotonic times were taken on.
    boot: str = ""
    #: When it took a running tree over: what it found (None: a fresh start).
    resumption: Resumption | None = None

    def seed(self, ctx: TreeContext) -> None:
        """Give the tree the journal's child lists to resume from, and journal its own; make
        a supervisor that has no list journalled reuse a running incarnation, or follow the
        lost one's; carry each supervisor's restart history over; journal the restarts to
        come."""
        state = self.rt.takeover
        if state is not None:
            ctx.live_journal = LiveJournal(state, self.live, self.journalled, self.pids)
            self.rt.live_journal = ctx.live_journal  # the trees its actors own journal there too
        if self.resumption is not None:
            ctx.resumption = self.resumption
        for path, incarnation in self.journalled.items():
            sup, _, child = path.rpartition("/")
            alive = self.running.get(path) == incarnation
            ctx.incarnations(sup)[child] = incarnation - 1 if alive else incarnation
        for sup, counters in self.live.counters().items() if self.live is not None else ():
            given = ctx.incarnations(sup)  # a supervisor started again later goes on from here
            for child, number in counters.items():
                if self.running.get(f"{sup}/{child}") != number:  # a running one: see above
                    given[child] = max(given.get(child, 0), number)
        now, wall, mono = trio.current_time(), time.time(), time.monotonic()
        same_boot = bool(self.boot) and self.boot == boot_id()
        for sup, stamps in self.restarts.items():
            ctx.carried_restarts[sup] = carried_times(stamps, same_boot, now, wall, mono)
        if state is not None:
            for sup, stamps in self.restarts.items():  # into this run's part of the journal
                for at, at_mono in stamps:
                    state.restarted(sup, at, at_mono if same_boot else None)
            ctx.on_restart = lambda sup, window: state.restarted(
                sup,
                window[0] - trio.current_time() + time.time(),
                window[0] - trio.current_time() + time.monotonic(),
                len(window),
            )

    async def resumed(self, ctx: TreeContext, heartbeat_timeout: float) -> None:
        """The tree is resumed: start again the trees its running actors own (resumed too),
        report what died in the gap (OTP's rules decide), stop what runs that no supervisor
        took over (a start the old controller had under way, a tree whose owner died), and
        say that it took over (one line, and the event log's ``takeover``)."""
        if self.resumption is None:
            return
        roots = [str(r["owned"]) for r in self.owned]
        skipped = await resume_owned(
            self.rt, self.rt.service, self.owned, self.procs, self.running, heartbeat_timeout
        )
        if skipped:
            log.warning(
                "takeover: not taken over: %s; their workers' actors are stopped",
                "; ".join(f"{root} ({why})" for root, why in sorted(skipped.items())),
            )
        known = [SINGLETONS, *roots]
        alive = {  # running, in no tree this standby resumed, nor under a declared supervisor
            path: number
            for path, number in self.found.items()
            if owned_by(path, known) is None and path.rpartition("/")[0] not in ctx.specs
        }
        unknown = [path for path in _not_taken_over(alive, ctx.specs) if path not in known]
        if unknown:  # actor meshes spawned on proc meshes: their owners may still call them
            log.warning(
                "takeover: not taken over (meshes spawned on proc meshes are not yet): %s; "
                "their actors run on, unsupervised, until the app ends",
                ", ".join(unknown),
            )

        # Before any exit is reported: a restarted owner's new tree must not hear these.
        def declared(path: str) -> bool:
            return path.rpartition("/")[0] in ctx.specs

        stop_unadopted = getattr(ctx.placement, "stop_unadopted", None)
        unadopted = await stop_unadopted(declared) if stop_unadopted else []
        lost = ctx.report_lost() + sum(sub.reported_lost for sub in ctx.subtrees)
        await ctx.settled()  # the driver starts on a tree whose supervisors handled them
        journal = ctx.live_journal
        if journal is not None and journal.not_resumed:
            log.warning(
                "takeover: not resumed, as this program cannot rebuild them: %s",
                "; ".join(f"{path} ({why})" for path, why in sorted(journal.not_resumed.items())),
            )
        if unadopted:
            log.warning(
                "takeover: stopped %d actors no supervisor had (their start was under way when "
                "the controller died): %s",
                len(unadopted),
                ", ".join(unadopted),
            )
        self.resumption = replace(
            self.resumption, adopted=len(self.running) - len(unadopted), lost=lost
        )
        ctx.resumption = self.resumption
        log.warning("takeover: %s", self.resumption)
        entry = LogEntry(trio.current_time(), LogKind.TAKEOVER, ctx.tree.id)
        ctx.events.append(replace(entry, reason=str(self.resumption)))

    def own(self) -> tuple[dict[str, Proc], dict[str, int]]:
        """The adopted processes and running actors of the declared tree alone (those of
        trees that actors own, and of the singletons, go to their own placements)."""
        roots = [SINGLETONS, *(str(r["owned"]) for r in self.owned)]
        procs = {p: proc for p, proc in self.procs.items() if owned_by(p, roots) is None}
        return procs, {p: n for p, n in self.running.items() if owned_by(p, roots) is None}

    async def stopped(self) -> None:
        """The tree stopped in order: nothing to take over; the fork server and the agents go
        now."""
        if self.hosts is not None:
            await self.hosts.close()
        state = self.rt.takeover
        if state is not None:
            state.stopped()
            state.journal.close()
            self.rt.takeover = None
        self.rt.forkserver.quit()
        self.lease.release()


async def resume(takeover: Takeover, tree: Supervisor | Mesh) -> Resumed:
    """Take the lease (waiting for it as a standby), bump the epoch, and take over the run the
    journal shows, if one is still running (and runs this `tree` and code, or the takeover says
    ``upgrade``); else start a fresh journal."""
    root = open_state_dir(takeover.dir)
    prints = fingerprint(tree)
    key = takeover_key(takeover.key)
    lease = Lease(root)
    standby = takeover.standby or run_is_standby()
    try:
        if not lease.try_acquire():
            if not standby:
                raise TakeoverError(
                    f"takeover: another controller holds the lease in {str(root)!r}; start this "
                    "one as its standby (Takeover(..., standby=True), otpmesh.run(main, "
                    "standby=True) or otpmesh run --standby job.py:main), or give it another dir"
                )
            if not await wait_for_lease(takeover, root, lease, key):
                return await _take(takeover, root, lease, standby, key, prints)  # no lease
        lease.check_held()
        return await _take(takeover, root, lease, standby, key, prints)
    except BaseException:
        lease.release()
        raise


async def _take(
    takeover: Takeover,
    root: Path,
    lease: Lease,
    standby: bool,
    key: bytes,
    prints: dict[str, Any],
) -> Resumed:
    last_write = _mtime(root / JOURNAL)  # the previous controller's last append, before ours
    records = read_journal(root)
    run = last_run(records)
    if standby and records and "stopped" in records[-1]:
        raise StandbyDoneError(
            f"the run this standby stood by for (state in {str(root)!r}) stopped in order: "
            "there is nothing to take over"
        )
    # A standby with another key, or other code, stops here, before it fences anything.
    secret = None if run.app is None else unwrap(key, run.app)
    if run.app is not None:
        _check_same_code(run.app, prints, takeover.upgrade)
    epoch = bump_epoch(root)
    hosts = takeover.hosts
    if secret is None or run.app is None:
        rt = await runtime()
        journal = Journal(
            root, epoch=epoch, compact_bytes=takeover.journal_bytes, nursery=rt.nursery
        )
        rt.takeover = TakeoverState(root, takeover.grace, epoch, journal)
        rt.takeover.app_started(rt.node.secret, key, prints)
        if hosts is not None:
            await hosts.start_fresh(rt, rt.takeover)
        return Resumed(rt, lease, hosts=hosts)
    rt = await runtime(secret)
    journal = Journal(
        root, epoch=epoch, after=records, compact_bytes=takeover.journal_bytes, nursery=rt.nursery
    )
    rt.takeover = TakeoverState(root, takeover.grace, epoch, journal)
    rt.takeover.app_started(secret, key, prints)  # a new run: what it adopts comes next
    on_hosts = [r for r in run.procs.values() if "hosts" in r.get("coords", {})]
    here = [r for r in run.procs.values() if "hosts" not in r.get("coords", {})]
    live: dict[str, Proc] = {}
    if here or not on_hosts:
        try:
            live = await adopt(rt, here)
        except OSError as exc:
            log.warning("takeover: nothing to take over in %s (%s): starting afresh", root, exc)
            if not on_hosts:
                return Resumed(rt, lease, hosts=hosts)
    if on_hosts and hosts is None:
        raise TakeoverError(
            "takeover: the run in the journal ran workers on host agents; start this "
            "controller with Takeover(..., hosts=otpmesh.TakeoverHosts(...)) to take them over"
        )
    if hosts is not None:
        hosts.expect_tokens(run.tokens)
        live.update(await hosts.adopt(rt, rt.takeover, on_hosts))
    boot = str(run.app.get("boot", ""))
    resumed = Resumed(rt, lease, restarts=run.restarts, live=run.live, hosts=hosts, boot=boot)
    resumed.owned = list(run.owned.values())
    resumed.found = {path: n for proc in live.values() for path, n in proc.actors.items()}
    for path, (incarnation, proc_id) in run.actors.items():
        resumed.journalled[path] = incarnation
        if proc_id in run.procs:
            resumed.pids[path] = int(run.procs[proc_id]["pid"])
        proc = live.get(proc_id)
        if proc is not None and proc.actors.get(path) == incarnation:
            resumed.procs[path] = proc
            resumed.running[path] = incarnation
        elif proc is not None:
            resumed.procs[path] = proc  # its actor died in the gap; its process serves again
    resumed.resumption = Resumption(
        epoch=epoch,
        previous_pid=int(run.app["app"]),
        adopted=len(resumed.running),
        lost=len(resumed.journalled) - len(resumed.running),
        processes=len(live),
        gap=round(max(0.0, time.time() - last_write), 3),
    )
    return resumed


def carried_times(
    stamps: list[Stamp], same_boot: bool, now: float, wall: float, mono: float
) -> tuple[float, ...]:
    """Restart `stamps` in this run's trio clock (it reads `now`; the wall and monotonic clocks
    read `wall` and `mono`), newest first: as long ago as they were by the monotonic clock when
    they were taken under this boot of this host, which no wall-clock step moves; else by the
    wall clock."""
    times = [
        now - (mono - at_mono) if same_boot and at_mono is not None else now - (wall - at)
        for at, at_mono in stamps
    ]
    return tuple(sorted(times, reverse=True))


def current_state() -> TakeoverState | None:
    """The takeover state of this trio run's controller, or None when its app runs without a
    takeover (``chaos`` journals its controller kills there, for the standby to read)."""
    try:
        rt = _RUNTIME.get()
    except LookupError:
        return None
    return rt.takeover


def journal_mark(state: TakeoverState, mark: dict[str, Any]) -> None:
    """Append `mark` to the journal, fsync'd: the process may be SIGKILLed right after."""
    state.journal.append(mark, durable=True)


def journal_marks(state: TakeoverState, key: str) -> list[dict[str, Any]]:
    """The records holding `key` in this app's journal, oldest first (a fresh run truncates it,
    so they are all this app's, across its takeovers)."""
    return [record for record in read_journal(state.root) if key in record]


def _check_same_code(app: dict[str, Any], prints: dict[str, Any], upgrade: bool) -> None:
    """Refuse to take over a run of other code or another tree (what differs, said), unless
    `upgrade`: then it is said as a warning."""
    said = differences(app.get("fingerprint"), prints)
    if not said:
        return
    what = "; ".join(said[:8]) + ("; ..." if len(said) > 8 else "")
    if upgrade:
        log.warning(
            "takeover: taking over a run of other code (upgrade=True): %s; adopted actors run "
            "the old code until they restart",
            what,
        )
        return
    raise TakeoverError(
        f"takeover: this program differs from the running controller's (pid {app.get('app')}): "
        f"{what}. Refusing to take it over: adopted actors would run the old code beside new "
        "incarnations running this one. Start the standby with the same code and tree, or with "
        "Takeover(..., upgrade=True) to take it over anyway"
    )


def _not_taken_over(journalled: dict[str, int], declared: Any) -> list[str]:
    """The roots of the journalled subtrees the declared tree does not have (trees its actors
    own): each named once, at the level below its owner."""
    roots = set()
    for path in journalled:
        if path in declared:
            continue
        parent, _, _ = path.rpartition("/")
        while parent and parent.rpartition("/")[0] and parent.rpartition("/")[0] not in declared:
            parent = parent.rpartition("/")[0]
        roots.add(parent or path)
    return sorted(roots)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
