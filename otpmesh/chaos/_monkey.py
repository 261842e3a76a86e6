"""``ChaosMonkey``: faults at random times in the background, drawn from a seed."""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from .._controller._app import App
from ._faults import Fault, throw
from ._plan import check_faults, target_paths


@dataclass
class ChaosMonkey:
    """Throws random faults at the actors matching `targets` (globs over paths), `rate` faults
    per second on average, kinds drawn with the weights in `faults`. The same `seed` gives the
    same schedule (times, kinds, target positions) against the same tree."""

    app: App
    seed: int = 0
    rate: float = 1.0
    targets: Sequence[str] = ("*",)
    faults: Mapping[str, float] = field(default_factory=lambda: {"crash": 1.0, "kill": 1.0})
    max_faults: int | None = None
    partition_seconds: float = 1.0
    injected: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_faults(self.faults)
        if not self.rate > 0:
            raise ValueError(
                f"rate must be a positive number of faults per second, not {self.rate}"
            )
        self.paths()

    def paths(self) -> list[str]:
        """The actor paths the monkey aims at, in a fixed order."""
        return target_paths(self.app, self.targets)

    def _draws(self) -> Iterator[tuple[float, str, str]]:
        """The faults this seed throws, in order: (seconds after the previous, kind, path)."""
        rng = random.Random(self.seed)
        kinds, weights = zip(*sorted(self.faults.items()), strict=True)
        paths = self.paths()
        while True:
            wait = rng.expovariate(self.rate)
            kind = rng.choices(kinds, weights)[0]
            yield wait, kind, paths[rng.randrange(len(paths))]

    def schedule(self, count: int) -> list[tuple[float, str, str]]:
        """The first `count` faults this seed throws: (seconds after the previous, kind, path)."""
        return list(itertools.islice(self._draws(), count))

    async def run(self) -> None:
        """Throw faults until cancelled (or `max_faults` were thrown)."""
        for wait, kind, path in itertools.islice(self._draws(), self.max_faults):
            await trio.sleep(wait)
            self.injected.append(
                await throw(self.app, kind, path, self.partition_seconds, "chaos monkey")
            )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ChaosMonkey]:
        """``async with monkey.running():`` throws faults for as long as the block runs."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()
