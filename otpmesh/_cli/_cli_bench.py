"""``otpmesh bench [core|rdma]``: the benchmarks, with progress on stderr and results on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import rich.progress
import trio
from rich.console import Console
from rich.table import Table

from .._core._errors import UsageError
from .._runtime._run import run
from ..bench import core as bench_core
from ..bench import hosts as bench_hosts

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
        help=f"a smoke test, not a measurement. core: {bench_core.QUICK_SUMMARY}; "
        f"rdma: {RDMA_QUICK_SIZES[0]} MiB, {RDMA_QUICK_REPEATS} repeats, no gloo",
    )
    bench_core.add_arguments(parser.add_argument_group("core suite"))
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
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print_table(result, sys.stdout)
    return 0


Measure = Callable[[bench_core.Progress], Awaitable[Any]]


def _core(args: argparse.Namespace) -> Measure:
    calls, pipelined, restarts = bench_core.iterations(args)
    return lambda progress: bench_core.run_benchmarks(
        calls, pipelined, restarts=restarts, progress=progress
    )


def _rdma(args: argparse.Namespace) -> Measure:
    from ..bench.rdma import measure
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
    progress.start()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.tick)
            result = await measure(progress)
            nursery.cancel_scope.cancel()
    finally:
        progress.finish()
    return result


class Progress:
    """Each step on `stream` as it starts: on a terminal, a rich progress list whose running
    step's clock ticks; otherwise one plain line per step."""

    def __init__(self, stream: TextIO) -> None:
        self.console = Console(file=stream, highlight=False)
        self.live = self.console.is_terminal
        self.started = time.monotonic()
        self._steps = rich.progress.Progress(
            rich.progress.SpinnerColumn(finished_text="[green]✓"),
            rich.progress.TextColumn("{task.description}"),
            rich.progress.TextColumn("[dim]{task.elapsed:.1f} s"),
            console=self.console,
            auto_refresh=False,  # refreshed by `tick`, a trio task, not by a thread
            redirect_stdout=False,  # stdout is for the results alone
            redirect_stderr=False,
        )
        self._step: rich.progress.TaskID | None = None

    def start(self) -> None:
        if self.live:
            self._steps.start()

    def __call__(self, name: str, number: int, total: int) -> None:
        self._end_step()
        label = f"[{number}/{total}] {name}"
        if self.live:
            self._step = self._steps.add_task(label, total=1)
        else:
            self._write(f"otpmesh bench: {label}")

    def _end_step(self) -> None:
        if self._step is not None:
            self._steps.update(self._step, completed=1)
            self._steps.stop_task(self._step)
        self._step = None

    async def tick(self) -> None:
        while self.live:
            self._steps.refresh()
            await trio.sleep(TICK_EVERY)

    def finish(self) -> None:
        self._end_step()
        if self.live:
            self._steps.stop()
        self._write(f"otpmesh bench: done in {time.monotonic() - self.started:.1f} s")

    def _write(self, text: str) -> None:
        self.console.print(text, markup=False, soft_wrap=True)
        self.console.file.flush()


def table(result: Any) -> Table:
    """Rows (a list of dicts) as columns; one object as `name  value` rows, nested names
    joined with dots."""
    out = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    if isinstance(result, list):
        columns = list(dict.fromkeys(k for row in result for k in row))
        for column in columns:
            out.add_column(column, justify="right")
        for row in result:
            out.add_row(*(_cell(row.get(c)) for c in columns))
        return out
    out.add_column("figure")
    out.add_column("value", justify="right")
    for name, value in _flatten(result, ""):
        out.add_row(name, value)
    return out


def print_table(result: Any, stream: TextIO) -> None:
    """The results as a rich table; into a pipe or a file at their full width, never cut."""
    console = Console(file=stream, highlight=False)
    rows = table(result)
    width = None if console.is_terminal else console.measure(rows).maximum
    console.print(rows, width=width, soft_wrap=width is not None)


def _flatten(value: Any, prefix: str) -> Any:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, _cell(value)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
