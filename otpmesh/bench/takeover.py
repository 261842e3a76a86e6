"""Benchmark of controller takeover: ``python -m otpmesh.bench takeover`` prints one JSON object.

The figure: the active controller SIGKILLed, to the standby's first successful call to a
surviving actor (the standby already running, waiting for the lease; target: at most 2 s on
one host). Beside it, in the same run, its baseline: a fresh start of the same tree (4 worker
processes) to its first reply, measured inside the active controller; that is what a restart
from scratch costs at least, before it recomputes the state a takeover keeps.

Each trial runs two real controllers (this module, ``--role active`` and ``--role standby``)
in a fresh state directory. Medians over the trials; the machine's load average is reported
beside them, since on a shared machine timings are noisy.

``--hosts`` (root, network namespaces: otpmesh.testing.netns): the same across hosts, the two
controllers and two host agents each in a namespace of its own, the 4 workers on the agents'
hosts; the active controller SIGKILLed, and (a second figure) its host cut off instead, to the
standby's first successful call (docs/guides/takeover.md, "Across hosts").

``--journal N``: the journal of a tree of ``JOURNAL_ACTORS`` actors that restarted N times,
written as the controller writes it, compacted (now) and never compacted (before): its size,
the standby's time to read and fold it, and how long each compaction held the controller's
event loop (docs/guides/takeover.md, "The state directory").
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import otpmesh
from otpmesh import launchers
from otpmesh._controller._lastrun import last_run
from otpmesh._runtime._journal import COMPACT_BYTES, Journal, read_journal
from otpmesh._runtime._statedir import bump_epoch, open_state_dir
from otpmesh.testing import netns

from .actor import BenchActor

TREE = otpmesh.Supervisor(
    "bench", children=[otpmesh.Mesh("workers", BenchActor, shape={"procs": 4})]
)
HOSTS_TREE = otpmesh.Supervisor(
    "bench", children=[otpmesh.Mesh("workers", BenchActor, shape={"hosts": 2, "procs": 2})]
)
PORT = 7392


def _takeover(state: str, listen: str | None, standby: bool = False) -> otpmesh.Takeover:
    if listen is None:
        return otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    hosts = otpmesh.TakeoverHosts(launchers.Static(hosts=2), listen=listen, port=PORT)
    return otpmesh.Takeover(dir=state, grace=60.0, standby=standby, hosts=hosts)


async def _active(state: str, listen: str | None) -> None:
    started = time.monotonic()
    tree = TREE if listen is None else HOSTS_TREE
    async with otpmesh.start(tree, takeover=_takeover(state, listen)) as app:
        await app.mesh("bench/workers")[0].echo(1)
        print(f"ready {time.monotonic() - started:.6f}", flush=True)
        await trio.sleep_forever()  # until the benchmark SIGKILLs it


async def _standby(state: str, listen: str | None) -> None:
    print("waiting", flush=True)
    tree = TREE if listen is None else HOSTS_TREE
    async with otpmesh.start(tree, takeover=_takeover(state, listen, standby=True)) as app:
        ident = await app.mesh("bench/workers")[0].ident()
        print(f"first call {time.monotonic():.6f} pid {ident[0]}", flush=True)


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"{proc.args!r} ended before printing {prefix!r} (status {proc.wait()})")


def trial(spaces: netns.NetnsHosts | None = None, cut: bool = False) -> dict[str, float]:
    """One takeover: seconds from SIGKILL (or, with `cut`, the active's host cut off) to the
    standby's first call, and the fresh start. With `spaces`: across hosts (the module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        me = [sys.executable, "-m", "otpmesh.bench.takeover", "--dir", state]
        at: list[list[str]] = [[], []]
        agents = []
        if spaces is not None:
            controllers = f"tcp:{spaces.ip(0)}:{PORT},tcp:{spaces.ip(1)}:{PORT}"
            for rank in (0, 1):
                argv = [*spaces.prefixes()[2 + rank], sys.executable, "-m", "otpmesh", "agent"]
                argv += ["--controller", controllers, "--rank", str(rank)]
                agents.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
            at = [[*spaces.prefixes()[i]] for i in (0, 1)]
            me = [*me, "--listen"]
        role = [[spaces.ip(i)] if spaces is not None else [] for i in (0, 1)]
        active = subprocess.Popen(
            [*at[0], *me, *role[0], "--role", "active"], stdout=subprocess.PIPE, text=True
        )
        standby = None
        try:
            fresh = float(_line(active, "ready").split()[1])
            # Only now: a standby started first would take the free lease and be the active.
            standby = subprocess.Popen(
                [*at[1], *me, *role[1], "--role", "standby"], stdout=subprocess.PIPE, text=True
            )
            _line(standby, "waiting")
            time.sleep(1.0)  # well inside its lease wait
            killed = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
            if cut and spaces is not None:
                spaces.cut(0)
            else:
                active.send_signal(signal.SIGKILL)
            first = float(_line(standby, "first call").split()[2])
            standby.wait(60)
            return {"takeover_s": first - killed, "fresh_start_s": fresh}
        finally:
            if cut and spaces is not None:
                spaces.reconnect(0)
            for proc in (active, standby, *agents):
                if proc is None:
                    continue
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def run(trials: int) -> dict[str, Any]:
    return _summary([trial() for _ in range(trials)])


def run_hosts(trials: int) -> dict[str, Any]:
    why = netns.unavailable()
    if why is not None:
        return {"skipped": f"network namespaces unavailable: {why}"}
    spaces = netns.make_hosts(4)  # 0: active, 1: standby, 2 and 3: agents
    try:
        killed = [trial(spaces) for _ in range(trials)]
        cut = [trial(spaces, cut=True) for _ in range(trials)]
    finally:
        spaces.remove()
    return {"sigkill": _summary(killed), "partition": _summary(cut)}


#: The tree of ``--journal``: this many actors (a quarter as many processes), each restarting
#: in turn under supervisors of intensity 5.
JOURNAL_ACTORS = 1000


def run_journal(restarts: int, trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {"restarts": restarts, "actors": JOURNAL_ACTORS}
    for name, bound in (("compacted", COMPACT_BYTES), ("never_compacted", 1 << 62)):
        with tempfile.TemporaryDirectory() as tmp:
            root = open_state_dir(Path(tmp) / "state")
            journal = trio.run(_journal_of, root, bound, restarts)
            reads = []
            for _ in range(trials):
                started = time.perf_counter()
                last_run(read_journal(root))
                reads.append(time.perf_counter() - started)
            out[name] = {
                "bytes": (root / "journal").stat().st_size,
                "read_and_fold_median_s": round(statistics.median(reads), 5),
                "compactions": len(journal.compactions),
                "compaction_median_s": round(statistics.median(journal.compactions or [0]), 5),
                "loop_pause_median_s": round(statistics.median(journal.pauses or [0]), 5),
                "loop_pause_max_s": round(max(journal.pauses or [0]), 5),
                "records_carried": journal.carried,
            }
    out["loadavg_1m"], out["cpus"] = os.getloadavg()[0], os.cpu_count()
    return out


async def _journal_of(root: Path, bound: int, restarts: int) -> Journal:
    """The journal a controller writes for ``--journal``'s tree (a checkpoint between each
    restart and the next, as between a real tree's)."""
    async with trio.open_nursery() as nursery:
        journal = Journal(root, epoch=bump_epoch(root), compact_bytes=bound, nursery=nursery)
        journal.append({"app": os.getpid(), "epoch": 1, "secret": "00" * 32}, durable=True)
        for rank in range(JOURNAL_ACTORS // 4):
            proc = {"proc": f"p{rank}", "pid": 1, "addr": "unix:/x", "rank": rank, "coords": {}}
            journal.append(proc)
        paths = [f"bench/s{i // 10}/a{i}" for i in range(JOURNAL_ACTORS)]
        for i, path in enumerate(paths):
            journal.append({"actor": path, "incarnation": 1, "proc": f"p{i // 4}"})
        for i in range(restarts):
            n = i % JOURNAL_ACTORS
            sup, window = paths[n].rpartition("/")[0], min(i // 10 + 1, 5)
            journal.append({"restart": sup, "at": time.time(), "window": window})
            actor = {"actor": paths[n], "incarnation": i // JOURNAL_ACTORS + 2}
            journal.append({**actor, "proc": f"p{n // 4}"})
            await trio.sleep(0)
    journal.close()
    return journal


def _summary(results: list[dict[str, float]]) -> dict[str, Any]:
    trials = len(results)
    takeover = statistics.median(r["takeover_s"] for r in results)
    fresh = statistics.median(r["fresh_start_s"] for r in results)
    return {
        "trials": trials,
        "takeover_median_s": round(takeover, 4),
        "takeover_s": [round(r["takeover_s"], 4) for r in results],
        "fresh_start_median_s": round(fresh, 4),
        "takeover_over_fresh_start": round(takeover / fresh, 3),
        "target_s": 2.0,
        "loadavg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench takeover",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--role", choices=["active", "standby"])
    parser.add_argument("--dir")
    parser.add_argument("--listen", help="(a role across hosts) this controller's address")
    parser.add_argument("--hosts", action="store_true", help="across hosts (root, netns)")
    parser.add_argument("--journal", type=int, metavar="N", help="the journal after N restarts")
    args = parser.parse_args(argv)
    if args.role == "active":
        otpmesh.run(_active, args.dir, args.listen)
    elif args.role == "standby":
        otpmesh.run(_standby, args.dir, args.listen)
    elif args.journal is not None:
        print(json.dumps(run_journal(args.journal, args.trials)))
    elif args.hosts:
        os.environ.setdefault("OTPMESH_SECRET", secrets.token_hex(16))  # the agents' and ours
        print(json.dumps(run_hosts(args.trials)))
    else:
        print(json.dumps(run(args.trials)))


if __name__ == "__main__":
    main()
