"""Faults by the dozen from a seed: the checks both schedulers share, and ``FaultPlan`` (faults
pinned to steps of the caller's loop)."""

from __future__ import annotations

import fnmatch
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._controller._app import App, context
from .._controller._takeover import journal_marks
from ._faults import CONTROLLER, FAULTS, Fault, kill_controller, record, takeover_of, throw


def check_kinds(kinds: Iterable[str]) -> None:
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")


def check_faults(faults: Mapping[str, float]) -> None:
    if CONTROLLER in faults:
        raise ValueError(
            "a controller kill is not drawn by weight: give FaultPlan.seeded(..., "
            "controller_kills=N) for N of them (a ChaosMonkey does not kill controllers)"
        )
    check_kinds(faults)
    if not faults or not all(weight >= 0 for weight in faults.values()) or not any(faults.values()):
        raise ValueError(f"faults needs a positive weight for at least one kind, not {faults!r}")


def target_paths(app: App, targets: Sequence[str]) -> list[str]:
    """The actor paths of `app`'s tree matching any glob in `targets`, in a fixed order."""
    workers = context(app).worker_paths()
    paths = [p for p in workers if any(fnmatch.fnmatchcase(p, g) for g in targets)]
    if not paths:
        raise ValueError(f"no actor of this tree matches targets {list(targets)}")
    return paths


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One entry of a ``FaultPlan``: at `step`, throw `kind` at the actor at `path`."""

    step: int
    kind: str
    path: str

    def __str__(self) -> str:
        if self.kind == CONTROLLER:
            return f"step {self.step}: kill the controller"
        return f"step {self.step}: {self.kind} {self.path}"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Faults pinned to steps of the caller's own loop, not to the clock: call
    ``await plan.inject(app, step)`` at the top of step `step` and it throws exactly the faults
    planned for it. The same plan throws the same faults at the same points on any machine.

    ``FaultPlan.seeded(...)`` draws a plan from a seed; a plan can also be written by hand:
    ``FaultPlan([PlannedFault(3, "kill", "rl/learner")])``."""

    faults: Sequence[PlannedFault]
    partition_seconds: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        check_kinds(fault.kind for fault in self.faults if fault.kind != CONTROLLER)
        steps = [fault.step for fault in self.faults]
        if steps != sorted(steps) or any(step < 0 for step in steps):
            raise ValueError(f"a plan's steps must be >= 0 and in order, not {steps}")

    @classmethod
    def seeded(
        cls,
        app: App,
        *,
        seed: int,
        steps: int,
        count: int,
        targets: Sequence[str] = ("*",),
        faults: Mapping[str, float] | None = None,
        first: int = 1,
        controller_kills: int = 0,
    ) -> FaultPlan:
        """`count` faults at distinct steps drawn from ``range(first, steps)``, kinds drawn with
        the weights in `faults` (crash and kill by default), each aimed at an actor matching
        `targets`; then `controller_kills` SIGKILLs of the controller itself (kind
        ``"controller"``), at other steps drawn from the same range, which needs an app run
        with a takeover (else ``TakeoverError``). The same arguments against the same tree
        give the same plan (the actor faults the same with or without controller kills)."""
        weights = {"crash": 1.0, "kill": 1.0} if faults is None else dict(faults)
        check_faults(weights)
        paths = target_paths(app, targets)
        if controller_kills:
            takeover_of(app, f"a plan with controller_kills={controller_kills}")
        if not 0 <= count + controller_kills <= max(0, steps - first):
            kills = f" and controller_kills={controller_kills}" if controller_kills else ""
            raise ValueError(
                f"count={count} faults{kills} do not fit at distinct steps in "
                f"range({first}, {steps})"
            )
        rng = random.Random(seed)
        kinds, kind_weights = zip(*sorted(weights.items()), strict=True)
        at = sorted(rng.sample(range(first, steps), count))
        planned = [
            PlannedFault(step, rng.choices(kinds, kind_weights)[0], rng.choice(paths))
            for step in at
        ]
        free = [step for step in range(first, steps) if step not in at]
        for step in rng.sample(free, controller_kills):
            planned.append(PlannedFault(step, CONTROLLER, CONTROLLER))
        return cls(tuple(sorted(planned, key=lambda fault: fault.step)))

    def at(self, step: int) -> list[PlannedFault]:
        """The faults planned for `step`, in plan order."""
        return [fault for fault in self.faults if fault.step == step]

    async def inject(self, app: App, step: int) -> list[Fault]:
        """Throw the faults planned for `step`, one after another, and return what was thrown.
        When there are any, it first waits for ``app.settled()``: the restarts an earlier fault
        caused are done, so each fault meets a running actor (and counts as one restart).

        A controller kill does not return (``kill_controller``). The standby that takes over
        runs its driver again, which resumes at this step and calls ``inject`` for it again:
        the faults up to the kill, which the journal holds, are not thrown twice; the kill's
        record is returned in their place and the step's later faults are thrown."""
        planned = self.at(step)
        if not planned:
            return []
        thrown: list[Fault] = []
        start = 0  # the first of this step's faults still to throw
        if any(fault.kind == CONTROLLER for fault in planned):
            state = takeover_of(app, "a plan's controller kill")
            for mark in journal_marks(state, "chaos"):
                if mark.get("step") == step and mark.get("plan") == str(self):
                    start = int(str(mark["index"])) + 1
                    detail = f"SIGKILL pid {mark['pid']}, the controller this one took over from"
                    thrown = [record(app, CONTROLLER, CONTROLLER, detail)]
        await app.settled()
        for index, fault in enumerate(planned[start:], start):
            if fault.kind == CONTROLLER:
                mark = {"step": step, "index": index, "plan": str(self)}
                await kill_controller(app, mark)
            else:
                why, seconds = f"planned, step {step}", self.partition_seconds
                thrown.append(await throw(app, fault.kind, fault.path, seconds, why))
        return thrown

    def __len__(self) -> int:
        return len(self.faults)

    def __str__(self) -> str:
        return "; ".join(map(str, self.faults)) or "no faults"
