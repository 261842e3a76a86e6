"""A controller's processes under a takeover: what it journals of them, and how a standby
adopts the live ones (the fork server first, then each worker) at its new epoch.

The journal and the lease are _statedir.py's; what the tree makes of the adopted processes is
the controller layer's (_controller/_takeover.py).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from .._core._errors import ActorDiedError, ActorError, FencedError, OtpmeshError, ProtocolError
from ._controller_runtime import Runtime
from ._proc import Proc
from ._statedir import FORKSERVER_SOCKET
from ._workerpipes import worker_pipes

log = logging.getLogger("otpmesh.takeover")

#: How long a standby waits for one worker to answer its adoption before counting it lost.
ADOPT_TIMEOUT = 5.0


async def adopt(rt: Runtime, procs: list[dict[str, Any]]) -> dict[str, Proc]:
    """Take the fork server and the journalled worker processes `procs` over at this runtime's
    epoch; the live ones (by proc id), each knowing which actors it runs. Raises OSError when
    the fork server is gone (nothing is left to take over) and FencedError when it serves a
    newer epoch."""
    state = rt.takeover
    if state is None or rt.nursery is None:
        raise RuntimeError("adopt needs a running runtime with a takeover state")
    known: dict[str, Proc] = {}
    for rec in procs:
        proc = Proc(rank=int(rec["rank"]), coords=dict(rec["coords"]), proc_id=str(rec["proc"]))
        proc.pid, proc.addr, proc.token = int(rec["pid"]), str(rec["addr"]), None
        proc.started = True  # it ran actors already: no start deadline
        proc.forked.set()
        known[proc.proc_id] = proc
        rt.adopted(proc)
    children = await rt.attach_fork_server(str(state.root / FORKSERVER_SOCKET), state.epoch)
    live: dict[str, Proc] = {}
    async with trio.open_nursery() as nursery:
        for proc in known.values():
            if proc.pid in children:
                nursery.start_soon(_adopt_one, rt, proc, live)
            else:
                rt.mark_exited(proc, "died while no controller was attached")
    return live


async def _adopt_one(rt: Runtime, proc: Proc, live: dict[str, Proc]) -> None:
    assert rt.takeover is not None
    ours, theirs = worker_pipes()  # its output and heartbeats come to this controller now
    try:
        with trio.fail_after(ADOPT_TIMEOUT):
            conn = await rt.node.connect(proc.addr)
            names = ("out", "err", "beat", "control")
            keys = {name: list(conn.pass_fd(fd)) for name, fd in zip(names, theirs, strict=True)}
            answer = await rt.node.sys_call(
                conn,
                "adopt",
                {
                    "epoch": rt.takeover.epoch,
                    "addr": rt.node.addr,
                    "pid": os.getpid(),
                    "pipes": keys,
                },
                proc.proc_id,
            )
            actors = adopted_actors(answer)
    except (OSError, OtpmeshError, trio.TooSlowError) as exc:
        for fd in ours:
            os.close(fd)
        if isinstance(exc, ActorError) and exc.type_name == FencedError.__name__:
            raise FencedError(exc.message) from None
        why = exc.reason if isinstance(exc, ActorDiedError) else str(exc) or type(exc).__name__
        log.warning("takeover: %s (pid %d) could not be adopted: %s", proc.proc_id, proc.pid, why)
        rt.kill(proc)
        rt.mark_exited(proc, f"could not be taken over: {why}")
        return
    finally:
        for fd in theirs:  # the connection passed duplicates
            os.close(fd)
    proc.conn = conn
    if answer.get("rewired") is True:
        rt.watch_pipes(proc, *ours)
    else:  # it took no pipes (nothing to beat with): not watched, never killed for silence
        for fd in ours:
            os.close(fd)
    proc.actors = actors
    for path in proc.actors:
        proc.named(path)
    proc.ready.set()
    live[proc.proc_id] = proc
    rt.takeover.proc_started(proc)


#: The most actors one adopted worker may say it runs (an answer is a peer's word).
MAX_ADOPTED_ACTORS = 1 << 16


def adopted_actors(answer: Any) -> dict[str, int]:
    """The actors (path -> incarnation) in a worker's answer to ``adopt``. The worker proved
    the secret, but an actor of the app runs in it and may have rewritten its runtime: an
    answer of another shape is that worker's failure to be adopted (a ProtocolError), never
    the takeover's, which goes on for every other worker."""
    actors = answer.get("actors") if isinstance(answer, dict) else None
    if (
        not isinstance(actors, dict)
        or len(actors) > MAX_ADOPTED_ACTORS
        or not all(type(k) is str and type(v) is int and v > 0 for k, v in actors.items())
    ):
        raise ProtocolError(
            "its answer to adopt is not a map of actor paths to incarnations (positive ints)"
        )
    return dict(actors)
