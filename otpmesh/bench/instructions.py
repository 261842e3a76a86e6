"""Instructions per round trip, each side counted by valgrind's callgrind:
``python -m otpmesh.bench instructions`` prints one JSON object.

Timings on a shared machine move with its load (the bare echo's median moved 95 -> 188 us
between runs minutes apart); the number of machine instructions a process executes does not.
Each side of a round trip runs as its own process under ``valgrind --tool=callgrind``: the caller,
and the server (an otpmesh worker node with the benchmark's actor, or the bare trio echo server of
the call suite, ``otpmesh.bench.core``). Both run the same warm-up, then `calls` round trips, once
with `calls` and once with none; the difference over `calls` is one round trip's instructions on
that side, start-up and shutdown cancelling out. A blocked ``epoll_wait`` executes nothing, so how
long a side waits for the other does not count. ``PYTHONHASHSEED`` is fixed so both runs hash alike,
and each side freezes its start-up's objects (``gc.freeze``) so that where a full collection falls
does not differ between the two runs by millions of instructions.

The otpmesh pair is two real nodes over a real, proved Unix connection: the caller's node calls
``ref.echo(i)`` on an ``ActorRef`` (the same path as ``await app.actor(...).echo(i)`` once the
actor is up), the worker's node runs the actor in an ``ActorHost``, as a worker process does.
What it leaves out is the runtime around them (the controller's supervision, heartbeats,
the watchdog thread), which does nothing per call.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from typing import Any

import trio

from . import _baseline
from .actor import BenchActor

#: Round trips before the counted ones (the same in both runs): connections dialled and proved,
#: caches and the allocator warm.
WARMUP = 50
#: Counted round trips per run (``--quick``: a smoke test, not a measurement).
FULL, QUICK = 1000, 200

_SECRET_ENV = "OTPMESH_BENCH_SECRET"
_START_ENV = "OTPMESH_BENCH_CALLGRIND_START"  # the helper library below, built for this run

# Callgrind starts each process with instrumentation off (Python's start-up and otpmesh's
# imports run about ten times faster that way); each side turns it on through this, once its
# imports are done. The macros are callgrind's client requests: no-ops outside valgrind.
_START_C = """#include <valgrind/callgrind.h>
void otpmesh_callgrind_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
"""
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


# ---------------------------------------------------------------- the sides (one process each)


async def _worker_side() -> None:
    """An otpmesh node serving the benchmark's actor until stdin closes."""
    from .._node._host import ActorHost
    from .._node._node import Node, set_current_node

    node = Node("worker", secret=bytes.fromhex(os.environ[_SECRET_ENV]))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve)
        set_current_node(node)
        host = ActorHost(node, lambda *_: None)
        spec = {"cls": BenchActor, "name": "bench", "id": "bench/0", "rank": 0}
        await host.spawn({**spec, "coords": {}, "shape": {}, "args": [], "kwargs": {}})
        print(node.addr.encode().hex(), flush=True)  # an abstract address starts with a NUL
        stdin = trio.lowlevel.FdStream(os.dup(0))
        while await stdin.receive_some(4096):
            pass
        nursery.cancel_scope.cancel()


async def _otpmesh_caller(addr: str, calls: int) -> None:
    from .._core._signature import Endpoints
    from .._node._mesh import ActorRef
    from .._node._node import Node, set_current_node
    from .._node._slot import Slot

    addr = bytes.fromhex(addr).decode()
    node = Node("caller", secret=bytes.fromhex(os.environ[_SECRET_ENV]))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve)
        set_current_node(node)
        await node.connect(addr)
        ref = ActorRef("bench", Endpoints.of(BenchActor.endpoints()), Slot("bench/0", addr))
        for i in range(WARMUP + calls):
            assert await ref.echo(i) == i
        nursery.cancel_scope.cancel()


async def _bare_caller(addr: str, calls: int) -> None:
    addr = bytes.fromhex(addr).decode()
    stream = await trio.open_unix_socket("\0" + addr)
    for i in range(WARMUP + calls):  # the same loop as the call suite's baseline
        await _baseline.bare_round_trip(stream, i)
    await stream.aclose()


# ---------------------------------------------------------------- the driver


def _start_library(tmp: str) -> str:
    source, library = f"{tmp}/start.c", f"{tmp}/start.so"
    with open(source, "w") as f:
        f.write(_START_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", library, source], check=True)
    return library


def _start_counting() -> None:
    import ctypes

    library = os.environ.get(_START_ENV)
    if library:  # a side run by hand, without the driver, counts nothing
        ctypes.CDLL(library).otpmesh_callgrind_start()


def _under_callgrind(out: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no"]
    cmd.append(f"--callgrind-out-file={out}")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen([*cmd, "-q", *argv], env=env, text=True, **kwargs)


def _instructions(path: str) -> int:
    with open(path, "rb") as f:
        found = _TOTALS.search(f.read())
    if found is None:
        raise RuntimeError(f"no totals in {path}")
    return int(found.group(1))


def _run_pair(kind: str, calls: int, tmp: str) -> tuple[int, int]:
    """(server, caller) instructions of one run: the warm-up and `calls` round trips."""
    me = [sys.executable, "-m", "otpmesh.bench.instructions"]
    server_out, caller_out = f"{tmp}/{kind}-{calls}-server", f"{tmp}/{kind}-{calls}-caller"
    if kind == "bare":
        addr = f"otpmesh-bench-insn-{os.getpid()}"
        argv = [*me, "--side", "echo", addr]
    else:
        argv = [*me, "--side", "worker"]
    server = _under_callgrind(server_out, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdin is not None
        line = server.stdout.readline().strip()
        addr = addr if kind == "bare" else bytes.fromhex(line).decode()
        caller = _under_callgrind(
            caller_out, [*me, "--side", kind, addr.encode().hex(), str(calls)]
        )
        if caller.wait() != 0:
            raise RuntimeError(f"the {kind} caller failed ({caller.returncode})")
        server.stdin.close()  # the worker's cue to stop; the bare server stops at the EOF
        if server.wait(timeout=300) != 0:
            raise RuntimeError(f"the {kind} server failed ({server.returncode})")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return _instructions(server_out), _instructions(caller_out)


def measure(calls: int = FULL, keep: str | None = None) -> dict[str, Any]:
    """Instructions per round trip on each side, for otpmesh and the bare echo; `keep`: a
    directory to leave callgrind's files in (``KIND-CALLS-SIDE``), for ``callgrind_annotate``."""
    os.environ.setdefault(_SECRET_ENV, secrets.token_hex(32))
    result: dict[str, Any] = {"calls": calls, "warmup": WARMUP}
    if keep is not None:
        os.makedirs(keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="otpmesh-insn-") as scratch:
        tmp = keep or scratch
        os.environ[_START_ENV] = _start_library(tmp)
        for kind in ("bare", "otpmesh"):
            server0, caller0 = _run_pair(kind, 0, tmp)
            server, caller = _run_pair(kind, calls, tmp)
            result[kind] = {
                "caller_per_call": round((caller - caller0) / calls),
                "server_per_call": round((server - server0) / calls),
            }
    for side in ("caller_per_call", "server_per_call"):
        result[f"{side.split('_')[0]}_vs_bare"] = round(
            result["otpmesh"][side] / result["bare"][side], 2
        )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m otpmesh.bench instructions", description=__doc__
    )
    parser.add_argument("--calls", type=int, default=FULL, help=f"counted round trips ({FULL})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} round trips: a smoke test")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="leave callgrind's files in DIR (callgrind_annotate DIR/otpmesh-N-caller)",
    )
    parser.add_argument("--side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        kind, *rest = args.side
        # Start-up's objects out of the collector's way: a full collection walks them (millions
        # of instructions), and where one falls differs between the N-call and 0-call runs.
        gc.collect()
        gc.freeze()
        _start_counting()
        if kind == "worker":
            trio.run(_worker_side)
        elif kind == "echo":
            trio.run(_baseline.echo_server, rest[0])
        else:
            caller = _bare_caller if kind == "bare" else _otpmesh_caller
            trio.run(caller, rest[0], int(rest[1]))
        return
    print(json.dumps(measure(QUICK if args.quick else args.calls, args.keep), indent=2))


if __name__ == "__main__":
    main()
