"""Benchmark of controller takeover: ``python -m otpmesh.bench_takeover`` prints one JSON object.

The figure: the active controller SIGKILLed, to the standby's first successful call to a
surviving actor (the standby already running, waiting for the lease; target: at most 2 s on
one host). Beside it, in the same run, its baseline: a fresh start of the same tree (4 worker
processes) to its first reply, measured inside the active controller; that is what a restart
from scratch costs at least, before it recomputes the state a takeover keeps.

Each trial runs two real controllers (this module, ``--role active`` and ``--role standby``)
in a fresh state directory. Medians over the trials; the machine's load average is reported
beside them, since on a shared machine timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

import otpmesh
from otpmesh.bench import BenchActor

TREE = otpmesh.Supervisor(
    "bench", children=[otpmesh.Mesh("workers", BenchActor, shape={"procs": 4})]
)


async def _active(state: str) -> None:
    started = time.monotonic()
    takeover = otpmesh.Takeover(dir=state, grace=60.0)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        await app.mesh("bench/workers")[0].echo(1)
        print(f"ready {time.monotonic() - started:.6f}", flush=True)
        await trio.sleep_forever()  # until the benchmark SIGKILLs it


async def _standby(state: str) -> None:
    print("waiting", flush=True)
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=True)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        ident = await app.mesh("bench/workers")[0].ident()
        print(f"first call {time.monotonic():.6f} pid {ident[0]}", flush=True)


def _line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise RuntimeError(f"{proc.args!r} ended before printing {prefix!r} (status {proc.wait()})")


def trial() -> dict[str, float]:
    """One takeover: seconds from SIGKILL to the standby's first call, and the fresh start."""
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        me = [sys.executable, "-m", "otpmesh.bench_takeover", "--dir", state, "--role"]
        active = subprocess.Popen([*me, "active"], stdout=subprocess.PIPE, text=True)
        standby = None
        try:
            fresh = float(_line(active, "ready").split()[1])
            # Only now: a standby started first would take the free lease and be the active.
            standby = subprocess.Popen([*me, "standby"], stdout=subprocess.PIPE, text=True)
            _line(standby, "waiting")
            time.sleep(1.0)  # well inside its lease wait
            killed = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
            active.send_signal(signal.SIGKILL)
            first = float(_line(standby, "first call").split()[2])
            standby.wait(60)
            return {"takeover_s": first - killed, "fresh_start_s": fresh}
        finally:
            for proc in (active, standby):
                if proc is None:
                    continue
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def run(trials: int) -> dict[str, Any]:
    results = [trial() for _ in range(trials)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--role", choices=["active", "standby"])
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.role == "active":
        otpmesh.run(_active, args.dir)
    elif args.role == "standby":
        otpmesh.run(_standby, args.dir)
    else:
        print(json.dumps(run(args.trials)))


if __name__ == "__main__":
    main()
