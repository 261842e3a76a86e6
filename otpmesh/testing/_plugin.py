"""otpmesh's pytest plugin (registered by entry point, so installing otpmesh enables it).

- ``run_app``: a fixture that runs a tree for a synchronous test. ``run_app(tree, body)`` starts
  the tree in-process under ``trio.testing.MockClock(autojump_threshold=0)`` (time-based behaviour
  is instant and exact), runs ``await body(app)`` and returns its result. ``placement="procs"``
  runs real worker processes on the real clock. Either way under a deadline.
- ``@pytest.mark.chaos(seed=N)``: the ``chaos_seed`` fixture gives N (give it to a ``ChaosMonkey``).
  Unmarked, the seed is drawn at random (``--chaos-seed=N`` pins it for every test); either way a
  failing test prints it, so any failure can be replayed.
- A failing test that used ``run_app`` shows each app's event log (injected faults included) in
  an "otpmesh event log" section of its report.

Nothing here imports hypothesis, and otpmesh itself only when a fixture is used.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

import pytest

if TYPE_CHECKING:
    from .._controller._app import App
    from .._core._spec import Mesh, Supervisor
    from .._core._supevents import LogEntry

T = TypeVar("T")

_APPS = pytest.StashKey[list["App"]]()
_SEED = pytest.StashKey[tuple[int, bool]]()  # (seed, pinned by a marker or the option?)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-seed",
        type=int,
        default=None,
        help="otpmesh: the seed the chaos_seed fixture gives to tests not marked chaos(seed=N)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "chaos(seed=None): an otpmesh fault-injection test; the chaos_seed fixture gives it "
        "`seed` (random when unset, printed when the test fails)",
    )


class AppRunner:
    """What the ``run_app`` fixture returns: call it to run a tree for one test."""

    def __init__(self, apps: list[App]) -> None:
        self.apps = apps

    def __call__(
        self,
        tree: Supervisor | Mesh,
        body: Callable[[App], Awaitable[T]],
        *,
        placement: Literal["local", "procs"] = "local",
        timeout: float | None = None,
    ) -> T:
        """Start `tree`, return ``await body(app)``; the tree stops when `body` returns.

        ``placement="local"`` (the default) runs under MockClock: `timeout` is then virtual time,
        a day by default (long sleeps cost nothing, and a deadlock jumps straight to it);
        with ``"procs"`` it is wall-clock time, 60 s by default.
        """
        if timeout is None:
            timeout = 86400.0 if placement == "local" else 60.0
        import trio
        import trio.testing

        from .._controller._app import start

        async def main() -> T:
            with trio.fail_after(timeout):
                async with start(tree, placement=placement) as app:
                    self.apps.append(app)  # before the body: its log is shown if body fails
                    return await body(app)

        if placement == "local":
            return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        return trio.run(main)


@pytest.fixture
def run_app(request: pytest.FixtureRequest) -> AppRunner:
    """``run_app(tree, body)``: run `tree` in-process under MockClock, return ``await body(app)``;
    a failing test prints the app's event log."""
    apps: list[App] = []
    request.node.stash[_APPS] = apps
    return AppRunner(apps)


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's faults: ``@pytest.mark.chaos(seed=N)``, else ``--chaos-seed``,
    else a random one; printed if the test fails."""
    marker = request.node.get_closest_marker("chaos")
    seed = marker.kwargs.get("seed") if marker is not None else None
    if seed is None:
        seed = request.config.getoption("--chaos-seed")
    pinned = seed is not None
    if seed is None:
        seed = random.randrange(2**32)
    request.node.stash[_SEED] = (int(seed), pinned)
    return int(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.when == "call":
        for title, text in _sections(item):
            report.sections.append((title, text))
    return report


def _sections(item: pytest.Item) -> list[tuple[str, str]]:
    sections = []
    seed = item.stash.get(_SEED, None)
    if seed is not None:
        value, pinned = seed
        how = "" if pinned else "; replay it with @pytest.mark.chaos(seed=...) or --chaos-seed"
        sections.append(("otpmesh chaos seed", f"chaos seed: {value}{how}\n"))
    for app in item.stash.get(_APPS, []):
        sections.append((f"otpmesh event log: {app.tree.id}", _format(app) + "\n"))
    return sections


def _format(app: App) -> str:
    return format_log(list(app.events))


def format_log(entries: Sequence[LogEntry], mark: int | None = None) -> str:
    """An event log one entry a line, times relative to the first; `mark` points at one line.
    (Here rather than in the machine's module so that the plugin never imports hypothesis.)"""
    from .._core._exits import describe

    t0 = entries[0].time if entries else 0.0
    lines = []
    for i, e in enumerate(entries):
        # A fault's reason is already words ("crash rl/rollouts/2 (chaos)").
        said = e.reason if e.kind == "fault_injected" else describe(e.reason)
        reason = "" if e.reason is None else f"  {said}"
        inc = "" if e.incarnation is None else f" #{e.incarnation}"
        arrow = ">>" if i == mark else "  "
        lines.append(f"{arrow} {e.time - t0:9.3f}  {e.kind!s:<26} {e.child_path}{inc}{reason}")
    return "\n".join(lines) or "   (empty)"
