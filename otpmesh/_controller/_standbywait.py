"""A standby's wait (_takeover.py): for the lease, in the kernel's queue; on hosts, for a
majority of the run's hosts to come to it having lost their controller; meanwhile, a lease
held by a process that is neither the active controller nor this standby is named, loudly."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import trio

from .._runtime._appkey import unwrap
from .._runtime._controller_runtime import runtime
from .._runtime._journal import read_journal
from .._runtime._lease import Lease, describe, holders
from ._lastrun import last_run
from ._takeoverspec import Hosts, Takeover

log = logging.getLogger("otpmesh.takeover")

#: How often a waiting standby looks at who holds the lease (it waits for the lease itself
#: in the kernel's queue), and how often it says so again while a stranger holds it.
HOLDER_POLL = 0.5
SQUATTER_REPEAT = 5.0
#: How often a standby on hosts reads the journal again for the run's hosts.
JOURNAL_POLL = 0.5


async def wait_for_lease(takeover: Takeover, root: Path, lease: Lease, key: bytes) -> bool:
    """A standby's wait: for the lease, in the kernel's queue (True once held), or, on hosts,
    for a majority of the run's hosts to come to it having lost their controller (False: a
    partitioned controller keeps the lease). Meanwhile a lease held by a process that is
    neither the journal's active controller nor this one is named, loudly, until it goes."""
    got = False
    async with trio.open_nursery() as nursery:

        async def take() -> None:
            nonlocal got
            await trio.to_thread.run_sync(lease.acquire, abandon_on_cancel=True)
            got = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(take)
        nursery.start_soon(_name_squatters, root, lease)
        if takeover.hosts is not None:
            await _wait_for_hosts(takeover.hosts, root, key)
            nursery.cancel_scope.cancel()
    return got


async def _wait_for_hosts(hosts: Hosts, root: Path, key: bytes) -> None:
    """Until a majority of the journal's hosts came to this standby having lost their
    controller."""
    ranks: set[int] = set()
    while True:
        # Read again and again: the active controller may still be starting its workers.
        run = last_run(read_journal(root))
        ranks = {int(r["coords"]["hosts"]) for r in run.procs.values() if "hosts" in r["coords"]}
        if run.app is not None:  # its agents come to this address: listen from now on
            hosts.expect_tokens(run.tokens)
            await hosts.attach(await runtime(unwrap(key, run.app)))
        came = hosts.witnesses() & ranks
        if ranks and 2 * len(came) > len(ranks):
            log.warning("takeover: %d of %d hosts lost their controller", len(came), len(ranks))
            return
        await trio.sleep(JOURNAL_POLL)


async def _name_squatters(root: Path, lease: Lease) -> None:
    """Say which process holds the lease when it is neither the active controller nor this
    standby (a same-user process can take it and keep it: then this standby cannot take over,
    and the user must know which process to stop), again every SQUATTER_REPEAT seconds."""
    said: dict[int, float] = {}
    active: int | None = None
    while True:
        for pid in holders(lease.path):
            if pid in (active, os.getpid()) or trio.current_time() < said.get(pid, -math.inf):
                continue
            run = last_run(read_journal(root))  # only for a holder it does not know yet
            active = int(run.app["app"]) if run.app is not None else None
            if pid == active:
                continue
            said[pid] = trio.current_time() + SQUATTER_REPEAT
            log.error(
                "takeover: the lease %s is held by %s, which is neither the active controller "
                "(%s) nor this standby: this standby cannot take the run over while it holds it; "
                "stop that process",
                lease.path,
                describe(pid),
                f"pid {active}" if active is not None else "none in the journal",
            )
        await trio.sleep(HOLDER_POLL)
