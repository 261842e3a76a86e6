"""The call suite: ``python -m otpmesh.bench`` (or ``python -m otpmesh.bench core``, or ``bash
.ci/dev bench``) prints one JSON object; ``otpmesh bench`` shows each step as it runs.

Every figure is a median (or rate) measured in this run, beside a baseline measured in the same
run: a bare trio Unix-socket echo between two processes with the same framing (4-byte length
prefix, msgpack payload). Timings on shared machines are noisy; compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import otpmesh

from . import _restarts
from ._baseline import bare_echo, echo_server, interleaved, ms, percentile, time_calls
from .actor import BenchActor

# ---------------------------------------------------------------- otpmesh


async def pipelined_tasks(mesh: otpmesh.ActorMesh, n: int) -> tuple[float, float]:
    """`n` calls in flight to one actor, each started in a task of its own: (calls per
    second, this process's CPU seconds per call)."""
    ref = mesh[0]

    async def calls() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(ref.echo, i)

    return await _per_call(n, calls)


async def pipelined_gather(mesh: otpmesh.ActorMesh, n: int) -> tuple[float, float]:
    """The same `n` calls through ``otpmesh.gather``: no task per call."""
    ref = mesh[0]
    return await _per_call(n, lambda: otpmesh.gather(*(ref.echo(i) for i in range(n))))


async def _per_call(n: int, calls: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """``await calls()`` (`n` calls): (calls per second, this process's CPU seconds per call)."""
    start, cpu = time.perf_counter(), time.process_time()
    await calls()
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


#: Rounds of the pipelined benchmarks: a task per call and gather alternate, medians reported.
PIPELINED_ROUNDS = 3


#: Called as each benchmark starts: (its name, its number from 1, how many there are).
Progress = Callable[[str, int, int], None]

#: Iterations: sequential calls, calls in flight, restarts of each kind (exception, SIGKILL,
#: group). QUICK is a smoke test of the benchmarks, not a measurement.
FULL = (2000, 10_000, (100, 20, 10))
#: Seconds between SIGKILL restarts measured in the steady state (the next spare ready).
WARM_SPACING = 0.3
QUICK = (100, 500, (10, 3, 2))


async def run_benchmarks(
    calls: int,
    pipelined: int,
    *,
    restarts: tuple[int, int, int] = FULL[2],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every figure; `restarts` is how many of each restart kind (exception, SIGKILL, group)."""
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(STEPS[done - 1], done, len(STEPS))

    async with bare_echo() as bare_call:
        step()
        bare = await time_calls(bare_call, calls)

        step()
        warm = await otpmesh.proc_mesh(procs=1)  # starts the fork server (and preloads torch)
        await warm.stop()

        step()
        start = time.perf_counter()
        procs = await otpmesh.proc_mesh(procs=4)
        mesh = await procs.spawn("bench", BenchActor)
        await mesh[0].echo(0)
        first_reply = time.perf_counter() - start

        step()
        await time_calls(mesh[0].echo, min(200, calls))
        unicast = await time_calls(mesh[0].echo, calls)
        bare_mixed, uni_mixed, ratios = await interleaved(bare_call, mesh[0].echo, calls)
    awaiting = await time_calls(mesh[0].echo_awaiting, max(min(200, calls), calls // 4))
    step()
    broadcast = await time_calls(mesh.echo, max(min(200, calls), calls // 4))
    step()
    tasks, gathers = [], []
    for _ in range(PIPELINED_ROUNDS):  # alternating: a change of load meets both
        tasks.append(await pipelined_tasks(mesh, pipelined))
        gathers.append(await pipelined_gather(mesh, pipelined))
    await procs.stop()

    # The restart benchmarks crash actors on purpose: keep their crash reports out of the output,
    # for these runs only (a caller in the same process, a test among others, keeps its logging).
    logger = logging.getLogger("otpmesh")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        step()
        after_exception = await _restarts.after_exception(restarts[0])
        step()
        after_sigkill, death_noticed = await _restarts.after_sigkill(restarts[1])
        warm_spare, _ = await _restarts.after_sigkill(max(restarts[1] // 2, 1), WARM_SPACING)
        step()
        group_after_sigkill = await _restarts.one_for_all_after_sigkill(restarts[2])
    finally:
        logger.setLevel(level)

    bare_p50 = statistics.median(bare)
    uni_p50 = statistics.median(unicast)
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "baseline_bare_trio_echo_us": {
            "p50": round(bare_p50 * 1e6, 1),
            "p99": round(percentile(bare, 0.99) * 1e6, 1),
        },
        "unicast_us": {
            "calls": calls,
            "p50": round(uni_p50 * 1e6, 1),
            "p99": round(percentile(unicast, 0.99) * 1e6, 1),
            "p50_vs_baseline": round(uni_p50 / bare_p50, 2),
        },
        # The baseline and unicast again, in alternating blocks of BLOCK calls: the median of
        # the rounds' ratios is the figure to compare (a change of load between the two
        # sequential runs above moves their ratio; here both halves of a round see it).
        "interleaved_us": {
            "rounds": len(ratios),
            "bare_p50": round(statistics.median(bare_mixed) * 1e6, 1),
            "unicast_p50": round(statistics.median(uni_mixed) * 1e6, 1),
            "ratio_median_of_rounds": round(statistics.median(ratios), 2),
            "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        },
        # The same round trip to an endpoint that awaits: the actor's task runs it, in a cancel
        # scope of its own (the general async path; `echo` above has none to await).
        "unicast_awaiting_us": {
            "p50": round(statistics.median(awaiting) * 1e6, 1),
            "p50_vs_baseline": round(statistics.median(awaiting) / bare_p50, 2),
        },
        "broadcast_4_us": {"p50": round(statistics.median(broadcast) * 1e6, 1)},
        # Calls in flight from one caller, each in a task of its own; then sent at once by
        # otpmesh.gather and waited for in one task. Medians of rounds run alternately; the CPU
        # is the caller's (this process's) per call.
        "pipelined_calls_per_s": _rate(pipelined, tasks),
        "pipelined_gather_calls_per_s": _rate(pipelined, gathers),
        "mesh_4_to_first_reply_s": round(first_reply, 3),
        "restart_ms": {
            "after_exception_to_next_reply_p50": ms(after_exception),
            "sigkill_to_death_noticed_p50": ms(death_noticed),
            "after_sigkill_to_next_reply_p50": ms(after_sigkill),
            # Kills WARM_SPACING apart: the steady state, a spare forked and proven beforehand.
            "after_sigkill_warm_spare_to_next_reply_p50": ms(warm_spare),
            "one_for_all_4_after_sigkill_p50": ms(group_after_sigkill),
            "after_exception_vs_baseline_round_trips": round(
                statistics.median(after_exception) / bare_p50, 1
            ),
        },
    }


#: The benchmarks in the order they run (progress reports these names).
STEPS = (
    "bare trio echo (the baseline)",
    "fork server warm-up",
    "4-process mesh to first reply",
    "unicast round trips",
    "broadcast to 4 actors",
    "pipelined calls (a task each, and gather)",
    "restart after an exception",
    "restart after a SIGKILL",
    "one-for-all group of 4 after a SIGKILL",
)


def _rate(in_flight: int, rounds: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "in_flight": in_flight,
        "rate": round(statistics.median(rate for rate, _ in rounds)),
        "caller_cpu_us_per_call": round(statistics.median(cpu for _, cpu in rounds) * 1e6, 1),
    }


def add_arguments(parser: Any) -> None:
    """The iteration counts on `parser` (an ArgumentParser or an argument group); shared with
    ``otpmesh bench``, which also reads ``--quick``."""
    parser.add_argument(
        "--calls", type=int, metavar="N", help=f"sequential calls per figure (default: {FULL[0]})"
    )
    parser.add_argument(
        "--pipelined", type=int, metavar="N", help=f"calls in flight at once (default: {FULL[1]})"
    )


QUICK_SUMMARY = f"{QUICK[0]} calls, {QUICK[1]} in flight, restarts {'/'.join(map(str, QUICK[2]))}"
QUICK_HELP = f"few iterations ({QUICK_SUMMARY}): a smoke test of the benchmarks, not a measurement"


def iterations(args: argparse.Namespace) -> tuple[int, int, tuple[int, int, int]]:
    """(calls, pipelined, restarts) from parsed options: --quick, then any explicit counts."""
    calls, pipelined, restarts = QUICK if args.quick else FULL
    return args.calls or calls, args.pipelined or pipelined, restarts


def main(argv: list[str] | None = None, *, epilog: str | None = None) -> None:
    """The call suite's command line; `epilog`: the other suites, as ``python -m otpmesh.bench``
    lists them under ``--help``."""
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench",
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    parser.add_argument("--echo-server", metavar="ADDR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_server:
        trio.run(echo_server, args.echo_server)
        return
    print("otpmesh bench: measuring (about 30 s; `otpmesh bench` shows progress)", file=sys.stderr)
    calls, pipelined, restarts = iterations(args)
    result = otpmesh.run(functools.partial(run_benchmarks, restarts=restarts), calls, pipelined)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
