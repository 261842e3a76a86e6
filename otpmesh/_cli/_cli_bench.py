"""``otpmesh bench [core|rdma]``: the benchmarks, with progress on stderr and results on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import trio

from .. import bench, bench_hosts
from .._core._errors import UsageError
from .._runtime._run import run

TICK_EVERY = 0.1  # seconds between redraws of the running step's clock on a terminal
RDMA_QUICK_SIZES, RDMA_QUICK_REPEATS = [1], 2

DESCRIPTION = """\
Run a benchmark suite: results on stdout (JSON, or a table), each step on
stderr as it starts (on a terminal, with its clock running).

  core  (the default) call round trips, broadcast, pipelined calls, mesh
        start-up and restart times, beside a bare trio socket echo measured
        in the same run (the figures of `python -m otpmesh.bench`)
  rdma  tensor-channel transfer speed per size and backend, beside a copy_
        and a torch.distributed (gloo) broadcast of the same size

Timings on shared machines are noisy: compare ratios, not absolutes.
"""

EXAMPLES = """\
examples:
  otpmesh bench                          # the core suite, one JSON object (about 30 s)
  otpmesh bench --quick --format table   # a smoke test, as a table
  otpmesh bench rdma --sizes 1 64 --backends shm tcp
"""


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="run the benchmarks (core or rdma) and print the results",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "suite",
        nargs="?",
        choices=("core", "rdma", "hosts"),
        default="core",
        metavar="SUITE",
        help="core, rdma or hosts (default: core)",
    )
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json (the default: one object for core, a list of rows for rdma) or table",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke test, not a measurement. core: {bench.QUICK_SUMMARY}; "
        f"rdma: {RDMA_QUICK_SIZES[0]} MiB, {RDMA_QUICK_REPEATS} repeats, no gloo",
    )
    bench.add_arguments(parser.add_argument_group("core suite"))
    rdma = parser.add_argument_group("rdma suite")
    rdma.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        metavar="MIB",
        help="tensor sizes in MiB (default: 1 16 64 256)",
    )
    rdma.add_argument(
        "--backends",
        nargs="+",
        metavar="NAME",
        help="backends to measure (default: every one this machine has)",
    )
    rdma.add_argument("--repeats", type=int, metavar="N", help="transfers per figure (default: 5)")
    rdma.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed baseline")
    hosts = parser.add_argument_group("hosts suite")
    hosts.add_argument(
        "--layouts",
        nargs="+",
        metavar="HxP",
        help=f"hosts x procs per host (default: {' '.join(bench_hosts.LAYOUTS)})",
    )
    hosts.add_argument("--broadcasts", type=int, metavar="N", help="timed per layout (500)")
    parser.set_defaults(handler=bench_command)


_OPTIONS = {
    "core": ("calls", "pipelined"),
    "rdma": ("sizes", "backends", "repeats", "no_gloo"),
    "hosts": ("layouts", "broadcasts"),
}


def bench_command(args: argparse.Namespace) -> int:
    for suite, options in _OPTIONS.items():
        misplaced = [n for n in options if getattr(args, n)] if suite != args.suite else []
        if misplaced:
            flag = "--" + misplaced[0].replace("_", "-")
            raise UsageError(
                f"{flag} is an option of the {suite} suite: otpmesh bench {suite} {flag}"
            )
    progress = Progress(sys.stderr)
    suites = {"core": _core, "rdma": _rdma, "hosts": _hosts}
    measure = suites[args.suite](args)
    result = run(_measured, measure, progress)
    print(json.dumps(result, indent=2) if args.format == "json" else "\n".join(table(result)))
    return 0


Measure = Callable[[bench.Progress], Awaitable[Any]]


def _core(args: argparse.Namespace) -> Measure:
    calls, pipelined, restarts = bench.iterations(args)
    return lambda progress: bench.run_benchmarks(
        calls, pipelined, restarts=restarts, progress=progress
    )


def _rdma(args: argparse.Namespace) -> Measure:
    from ..bench_rdma import measure
    from ..rdma import backends

    quick = args.quick
    sizes = args.sizes or (RDMA_QUICK_SIZES if quick else [1, 16, 64, 256])
    repeats = args.repeats or (RDMA_QUICK_REPEATS if quick else 5)
    names = args.backends or backends()
    unknown = [b for b in names if b not in backends()]
    if unknown:
        raise UsageError(f"--backends: {unknown[0]!r} is not available here: {backends()}")
    gloo = not (args.no_gloo or quick)
    return lambda progress: measure(sizes, names, repeats, gloo, progress=progress)


def _hosts(args: argparse.Namespace) -> Measure:
    default = ["1x2", "2x2"] if args.quick else bench_hosts.LAYOUTS
    try:
        layouts = bench_hosts.parse_layouts(args.layouts or default)
    except ValueError as exc:
        raise UsageError(f"--layouts: {exc}") from None
    broadcasts = args.broadcasts or (50 if args.quick else 500)
    os.environ.setdefault("OTPMESH_PRELOAD", "")  # these workers need no torch
    return lambda progress: bench_hosts.run(layouts, broadcasts, progress)


async def _measured(measure: Measure, progress: Progress) -> Any:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress.tick)
        result = await measure(progress)
        nursery.cancel_scope.cancel()
    progress.finish()
    return result


class Progress:
    """Each step on `stream` as it starts; on a terminal, its clock runs until the next one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.started = time.monotonic()
        self._step: tuple[str, float] | None = None

    def __call__(self, name: str, number: int, total: int) -> None:
        self._end_step()
        label = f"[{number}/{total}] {name}"
        self._step = (label, time.monotonic())
        if not self.live:
            self._write(f"otpmesh bench: {label}\n")

    def _end_step(self) -> None:
        if self._step is not None and self.live:
            label, since = self._step
            self._write(f"\r\x1b[K{label}  {time.monotonic() - since:.1f} s\n")
        self._step = None

    async def tick(self) -> None:
        while self.live:
            if self._step is not None:
                label, since = self._step
                self._write(f"\r\x1b[K{label}  {time.monotonic() - since:.1f} s")
            await trio.sleep(TICK_EVERY)

    def finish(self) -> None:
        self._end_step()
        self._write(f"otpmesh bench: done in {time.monotonic() - self.started:.1f} s\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def table(result: Any) -> list[str]:
    """Rows (a list of dicts) as columns; one object as `name  value` lines, nested names
    joined with dots."""
    if isinstance(result, list):
        columns = list(dict.fromkeys(k for row in result for k in row))
        cells = [columns] + [[_cell(row.get(c)) for c in columns] for row in result]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        return ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    flat = list(_flatten(result, ""))
    width = max((len(k) for k, _ in flat), default=0)
    return [f"{k.ljust(width)}  {v}" for k, v in flat]


def _flatten(value: Any, prefix: str) -> Any:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, _cell(value)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
