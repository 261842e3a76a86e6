"""Benchmarks: ``python -m otpmesh.bench`` (or ``bash .ci/dev bench``) prints one JSON object.

Every figure is a median (or rate) measured in this run, beside a baseline measured in the same
run: a bare trio Unix-socket echo between two processes with the same framing (4-byte length
prefix, msgpack payload). Timings on shared machines are noisy; compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import trio

import otpmesh
from otpmesh.bench_actor import BenchActor

_LEN = struct.Struct(">I")


# ---------------------------------------------------------------- hangs (--hangs)


async def _deadline_to_reply(endpoint: str, deadline: float, n: int) -> list[float]:
    """Seconds past `deadline` from a call that hangs to the restarted actor's first reply."""
    tree = otpmesh.Supervisor(
        "h",
        intensity=n + 1,
        period=3600,
        children=[otpmesh.Worker("w", BenchActor, progress_deadline=deadline)],
    )
    late = []
    async with otpmesh.start(tree) as app:
        w = app.actor("h/w")
        for _ in range(n):
            before = await w.ident()
            started = time.perf_counter()
            with contextlib.suppress(otpmesh.ActorDiedError):
                await (w.stuck(600.0) if endpoint == "stuck" else w.wedged())
            while await _until_answers(w.ident) == before:
                await trio.sleep(0)
            late.append(time.perf_counter() - started - deadline)
    return late


async def _stacks_of(actors: int, n: int) -> list[float]:
    mesh = otpmesh.Mesh("s", BenchActor, shape={"procs": actors})
    times = []
    async with otpmesh.start(mesh) as app:
        for _ in range(n):
            started = time.perf_counter()
            stacks = await app.stacks()
            times.append(time.perf_counter() - started)
            assert len(stacks.actors) == actors
    return times


async def hangs_benchmark(n: int = 5, deadline: float = 0.5, actors: int = 100) -> dict[str, Any]:
    """Progress deadlines and stacks: how long past its deadline a hung actor answers again
    (restarted), for a plain-def endpoint (its process killed) and an async one (cancelled);
    and ``app.stacks()`` over `actors` worker processes."""
    sync = await _deadline_to_reply("stuck", deadline, n)
    async_ = await _deadline_to_reply("wedged", deadline, n)
    stacks = await _stacks_of(actors, n)
    return {
        "deadline_s": deadline,
        "trials": n,
        "sync_past_deadline_p50_ms": _ms(sync),
        "async_past_deadline_p50_ms": _ms(async_),
        "stacks_actors": actors,
        "stacks_p50_ms": _ms(stacks),
    }


# ---------------------------------------------------------------- shutdown (--shutdown)


async def _stop_stuck(tree: otpmesh.Supervisor | otpmesh.Mesh, paths: list[str]) -> float:
    """Seconds to stop `tree` (the end of its block, as after Ctrl-C) while every actor at
    `paths` is stuck in a plain-def endpoint."""

    async def stuck(path: str) -> None:
        with contextlib.suppress(otpmesh.OtpmeshError):
            await app.actor(path).stuck(600.0)

    async with otpmesh.start(tree) as app:
        async with trio.open_nursery() as calls:
            for path in paths:
                calls.start_soon(stuck, path)
            await trio.sleep(1.0)  # every call is in time.sleep by now
            calls.cancel_scope.cancel()
        started = time.perf_counter()
    return time.perf_counter() - started


async def shutdown_benchmark(shutdown: float = 5.0, actors: int = 4) -> dict[str, Any]:
    """Stopping `actors` actors stuck in plain-def endpoints, each with `shutdown` seconds:
    as a Mesh (stopped all at once) and as an ordinary supervisor of the same workers (one at
    a time, newest first: how a Mesh stopped before it stopped in parallel)."""
    mesh = otpmesh.Mesh("mesh", BenchActor, shape={"procs": actors}, shutdown=shutdown)
    ordered = otpmesh.Supervisor(
        "ordered",
        children=[otpmesh.Worker(str(r), BenchActor, shutdown=shutdown) for r in range(actors)],
    )
    ranks = [str(r) for r in range(actors)]
    return {
        "actors": actors,
        "shutdown_s": shutdown,
        "mesh_stop_s": round(await _stop_stuck(mesh, [f"mesh/{r}" for r in ranks]), 2),
        "ordered_stop_s": round(await _stop_stuck(ordered, [f"ordered/{r}" for r in ranks]), 2),
    }


# ---------------------------------------------------------------- restarts


async def _until_answers(call: Callable[[], Awaitable[Any]]) -> Any:
    """Call until it succeeds (a SIGKILL is noticed asynchronously, a pending call may fail)."""
    while True:
        try:
            return await call()
        except otpmesh.ActorDiedError:
            await trio.sleep(0)


async def _restart_after_exception(n: int) -> list[float]:
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[otpmesh.Worker("w", BenchActor)])
    samples = []
    async with otpmesh.start(tree) as app:
        ref = app.actor("b/w")
        await ref.echo(0)
        for _ in range(n):
            start = time.perf_counter()
            try:
                await ref.fail()
            except otpmesh.ActorError:
                pass
            await ref.echo(1)  # waits for the new incarnation
            samples.append(time.perf_counter() - start)
    return samples


async def _restart_after_sigkill(n: int, spacing: float = 0.0) -> tuple[list[float], list[float]]:
    """Seconds from a SIGKILL to the next reply (the new incarnation's), and to the death
    noticed: its supervisor deciding on the child's exit (the log entry's time). `spacing`:
    seconds between one restart and the next kill (0: back to back, so the next spare is
    mostly still on its way: its fork is asked ``_spare.ASK_AFTER`` after the actor is up)."""
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[otpmesh.Worker("w", BenchActor)])
    samples, noticed = [], []
    async with otpmesh.start(tree) as app:
        ref = app.actor("b/w")
        for _ in range(n):
            pid, _token = await ref.ident()
            await app.settled()
            exits = len(app.events.of_kind("child_exited"))
            await trio.sleep(spacing)
            start, clock = time.perf_counter(), trio.current_time()
            os.kill(pid, signal.SIGKILL)
            while (await _until_answers(ref.ident))[0] == pid:
                await trio.sleep(0)
            samples.append(time.perf_counter() - start)
            noticed.append(app.events.of_kind("child_exited")[exits].time - clock)
    return samples, noticed


async def _one_for_all_after_sigkill(n: int) -> list[float]:
    mesh = otpmesh.Mesh(
        "dp", BenchActor, shape={"procs": 4}, strategy=otpmesh.ONE_FOR_ALL, intensity=n + 1
    )
    tree = otpmesh.Supervisor("b", intensity=n + 1, children=[mesh])
    samples = []
    async with otpmesh.start(tree) as app:
        dp = app.mesh("b/dp")
        for _ in range(n):
            before = (await dp.ident()).values()
            start = time.perf_counter()
            os.kill(before[0][0], signal.SIGKILL)
            while True:
                now = (await _until_answers(dp.ident)).values()
                if all(a[1] != b[1] for a, b in zip(now, before, strict=True)):
                    break
                await trio.sleep(0)
            samples.append(time.perf_counter() - start)
    return samples


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _time_calls(fn: Callable[[int], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await fn(i)
        samples.append(time.perf_counter() - start)
    return samples


# ---------------------------------------------------------------- the bare baseline


def bare_frame(i: int, method: str = "echo") -> bytes:
    """The baseline's request: a length-prefixed msgpack call frame, as otpmesh's own."""
    out: bytes = msgpack.packb([0, i, "bench/0", method, [i], {}])
    return _LEN.pack(len(out)) + out


def frame_complete(buf: bytes) -> bool:
    """Whether `buf` holds one whole length-prefixed frame (the baseline reads one reply)."""
    return len(buf) >= 4 and len(buf) >= 4 + _LEN.unpack_from(buf)[0]


async def bare_round_trip(stream: trio.SocketStream, i: int) -> None:
    """One baseline round trip: a call frame written, its whole reply read."""
    await stream.send_all(bare_frame(i))
    got = b""
    while not frame_complete(got):
        got += await stream.receive_some(1 << 16)


async def echo_server(addr: str) -> None:
    """The bare baseline: a trio echo server on abstract Unix socket `addr` that answers each
    frame with a reply frame, nothing else (``python -m otpmesh.bench --echo-server ADDR``)."""
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind("\0" + addr)  # abstract socket: argv cannot carry the NUL
    listener.listen(1)
    print("ready", flush=True)
    sock, _ = await listener.accept()
    stream = trio.SocketStream(sock)
    buf = b""
    while data := await stream.receive_some(1 << 16):
        buf += data
        while frame_complete(buf):
            (size,) = _LEN.unpack_from(buf)
            msg = msgpack.unpackb(buf[4 : 4 + size])
            buf = buf[4 + size :]
            out = msgpack.packb([2, msg[1], msg[4]])
            await stream.send_all(_LEN.pack(len(out)) + out)


@contextlib.asynccontextmanager
async def _bare_echo() -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """A bare echo server in another process, for the block: yields one round trip to it."""
    addr = f"otpmesh-bench-echo-{os.getpid()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "otpmesh.bench", "--echo-server", addr],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        stream = await trio.open_unix_socket("\0" + addr)

        async def one(i: int) -> None:
            await bare_round_trip(stream, i)

        await _time_calls(one, 200)
        yield one
        await stream.aclose()
    finally:
        server.kill()
        server.wait()


#: Calls per block of the interleaved baseline and unicast (rounds: the calls over this).
BLOCK = 200


async def _interleaved(
    bare: Callable[[int], Awaitable[Any]], call: Callable[[int], Awaitable[Any]], calls: int
) -> tuple[list[float], list[float], list[float]]:
    """(bare samples, unicast samples, per-round ratios of their medians): alternating blocks,
    so a change in the machine's load between rounds weighs on both halves alike."""
    block = min(BLOCK, calls)
    bares: list[float] = []
    unicasts: list[float] = []
    ratios: list[float] = []
    for _ in range(max(1, calls // block)):
        b = await _time_calls(bare, block)
        u = await _time_calls(call, block)
        bares += b
        unicasts += u
        ratios.append(statistics.median(u) / statistics.median(b))
    return bares, unicasts, ratios


# ---------------------------------------------------------------- otpmesh


async def _pipelined(mesh: otpmesh.ActorMesh, n: int) -> tuple[float, float]:
    """`n` calls in flight to one actor, each started in a task of its own: (calls per
    second, this process's CPU seconds per call)."""
    ref = mesh[0]

    async def calls() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(ref.echo, i)

    return await _per_call(n, calls)


async def _pipelined_gather(mesh: otpmesh.ActorMesh, n: int) -> tuple[float, float]:
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

    async with _bare_echo() as bare_echo:
        step()
        bare = await _time_calls(bare_echo, calls)

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
        await _time_calls(mesh[0].echo, min(200, calls))
        unicast = await _time_calls(mesh[0].echo, calls)
        bare_mixed, uni_mixed, ratios = await _interleaved(bare_echo, mesh[0].echo, calls)
    awaiting = await _time_calls(mesh[0].echo_awaiting, max(min(200, calls), calls // 4))
    step()
    broadcast = await _time_calls(mesh.echo, max(min(200, calls), calls // 4))
    step()
    tasks, gathers = [], []
    for _ in range(PIPELINED_ROUNDS):  # alternating: a change of load meets both
        tasks.append(await _pipelined(mesh, pipelined))
        gathers.append(await _pipelined_gather(mesh, pipelined))
    await procs.stop()

    # The restart benchmarks crash actors on purpose: keep their crash reports out of the output,
    # for these runs only (a caller in the same process, a test among others, keeps its logging).
    logger = logging.getLogger("otpmesh")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        step()
        after_exception = await _restart_after_exception(restarts[0])
        step()
        after_sigkill, death_noticed = await _restart_after_sigkill(restarts[1])
        warm_spare, _ = await _restart_after_sigkill(max(restarts[1] // 2, 1), WARM_SPACING)
        step()
        group_after_sigkill = await _one_for_all_after_sigkill(restarts[2])
    finally:
        logger.setLevel(level)

    bare_p50 = statistics.median(bare)
    uni_p50 = statistics.median(unicast)
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "baseline_bare_trio_echo_us": {
            "p50": round(bare_p50 * 1e6, 1),
            "p99": round(_percentile(bare, 0.99) * 1e6, 1),
        },
        "unicast_us": {
            "calls": calls,
            "p50": round(uni_p50 * 1e6, 1),
            "p99": round(_percentile(unicast, 0.99) * 1e6, 1),
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
            "after_exception_to_next_reply_p50": _ms(after_exception),
            "sigkill_to_death_noticed_p50": _ms(death_noticed),
            "after_sigkill_to_next_reply_p50": _ms(after_sigkill),
            # Kills WARM_SPACING apart: the steady state, a spare forked and proven beforehand.
            "after_sigkill_warm_spare_to_next_reply_p50": _ms(warm_spare),
            "one_for_all_4_after_sigkill_p50": _ms(group_after_sigkill),
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


def _ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 2)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    parser.add_argument("--echo-server", metavar="ADDR", help=argparse.SUPPRESS)
    parser.add_argument(
        "--shutdown",
        action="store_true",
        help="only the stop of 4 actors stuck in plain-def endpoints (5 s shutdown each): as a "
        "Mesh (all at once) and as an ordinary supervisor (one at a time); about 35 s",
    )
    parser.add_argument(
        "--hangs",
        action="store_true",
        help="only progress deadlines (time past a 0.5 s deadline to the restarted actor's "
        "first reply, plain-def and async) and app.stacks() over 100 processes; about 40 s",
    )
    parser.add_argument(
        "--monarch",
        action="store_true",
        help="only calls through otpmesh.monarch beside the native API (unicast, broadcast to "
        "4, pipelined; .get() from a thread beside await); about 30 s",
    )
    args = parser.parse_args(argv)
    if args.monarch:
        from .bench_monarch import monarch_benchmark

        calls, pipelined, _ = iterations(args)
        print(json.dumps(otpmesh.run(monarch_benchmark, min(calls, 1000), pipelined), indent=2))
        return
    if args.hangs:
        print(json.dumps(otpmesh.run(hangs_benchmark), indent=2))
        return
    if args.echo_server:
        trio.run(echo_server, args.echo_server)
        return
    if args.shutdown:
        print(json.dumps(otpmesh.run(shutdown_benchmark), indent=2))
        return
    print("otpmesh bench: measuring (about 30 s; `otpmesh bench` shows progress)", file=sys.stderr)
    calls, pipelined, restarts = iterations(args)
    result = otpmesh.run(functools.partial(run_benchmarks, restarts=restarts), calls, pipelined)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
