"""Hypothesis strategies for supervision trees and the faults to throw at them.

``supervision_trees(actor)`` draws valid specs of bounded size; ``fault_schedules(tree)`` draws
steps for ``otpmesh.testing.simulate`` (the reference model) or for a running app. Both take
knobs, so the Erlang differential tests (OTP's strategies only, an hour-long period) and the
driver tests (every strategy, a short period and a moving clock) draw from the same code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from hypothesis import strategies as st

from .._core._reasons import KILLED, NORMAL, SHUTDOWN
from .._core._spec import (
    ALL_SIGNIFICANT,
    ANY_SIGNIFICANT,
    BRUTAL_KILL,
    INFINITY,
    NEVER,
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    PERMANENT,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    AutoShutdown,
    Mesh,
    Restart,
    ShutdownSpec,
    Strategy,
    Supervisor,
    Worker,
    walk,
)
from ._steps import Advance, Call, Crash, Step, StopSupervisor

OTP_STRATEGIES: tuple[Strategy, ...] = (ONE_FOR_ONE, ONE_FOR_ALL, REST_FOR_ONE)
#: Exit reasons a fault may carry: normal ones, and abnormal ones.
REASONS: tuple[object, ...] = (NORMAL, SHUTDOWN, (SHUTDOWN, "detail"), "boom", KILLED)
STOP_REASONS: tuple[object, ...] = (SHUTDOWN, NORMAL, "boom")

CallOp = Literal["start_child", "terminate_child", "restart_child", "delete_child"]


@st.composite
def _child_flags(draw: st.DrawFn, parent_auto: AutoShutdown) -> tuple[Restart, bool]:
    restart = draw(st.sampled_from([PERMANENT, PERMANENT, TRANSIENT, TEMPORARY]))
    significant = parent_auto is not NEVER and restart is not PERMANENT and draw(st.booleans())
    return restart, significant


@st.composite
def supervision_trees(
    draw: st.DrawFn,
    actor: type | str,
    *,
    root_id: str = "root",
    max_depth: int = 2,
    max_children: int = 4,
    strategies: Sequence[Strategy] = OTP_STRATEGIES,
    intensities: Sequence[int] = (0, 1, 2, 3),
    periods: Sequence[float] = (3600.0,),
    shutdowns: Sequence[ShutdownSpec] = (BRUTAL_KILL, 1.0, INFINITY),
    auto_shutdown: bool = True,
    _depth: int = 0,
    _flags: tuple[Restart, bool] = (PERMANENT, False),
) -> Supervisor:
    """A valid Supervisor spec: nested up to `max_depth`, workers of class `actor`."""
    autos = [NEVER, NEVER, ANY_SIGNIFICANT, ALL_SIGNIFICANT] if auto_shutdown else [NEVER]
    auto = draw(st.sampled_from(autos))
    children: list[Supervisor | Worker] = []
    for i in range(draw(st.integers(1, max_children))):
        restart, significant = draw(_child_flags(auto))
        if _depth < max_depth and draw(st.integers(0, 3)) == 0:
            children.append(
                draw(
                    supervision_trees(
                        actor,
                        root_id=f"s{i}",
                        max_depth=max_depth,
                        max_children=max_children,
                        strategies=strategies,
                        intensities=intensities,
                        periods=periods,
                        shutdowns=shutdowns,
                        auto_shutdown=auto_shutdown,
                        _depth=_depth + 1,
                        _flags=(restart, significant),
                    )
                )
            )
        else:
            shutdown = draw(st.sampled_from(list(shutdowns)))
            children.append(
                Worker(f"w{i}", actor, restart=restart, shutdown=shutdown, significant=significant)
            )
    return Supervisor(
        root_id,
        strategy=draw(st.sampled_from(list(strategies))),
        intensity=draw(st.sampled_from(list(intensities))),
        period=draw(st.sampled_from(list(periods))),
        auto_shutdown=auto,
        children=children,
        restart=_flags[0],
        significant=_flags[1],
    )


@st.composite
def owned_trees(
    draw: st.DrawFn,
    /,
    actor: type | str,
    owner: type | str,
    *,
    max_owners: int = 2,
    **knobs: Any,
) -> tuple[Supervisor, dict[str, Supervisor | Mesh]]:
    """A tree (``supervision_trees(actor, **knobs)``) up to `max_owners` of whose workers are
    `owner` actors, and the ``owned`` mapping for ``simulate`` and ``SupervisionMachine``.

    An owner is constructed with one argument, the spec of the subtree it starts in its
    ``on_start`` (``await otpmesh.context().start(spec)``): a ONE_FOR_ONE Mesh of 2 `actor`s or
    a small Supervisor of `actor` workers, drawn with the same knobs. Specs as arguments travel
    only in-process: run such trees with ``placement="local"``.
    """
    tree = draw(supervision_trees(actor, **knobs))
    workers, _ = tree_paths(tree)
    owners = draw(st.lists(st.sampled_from(workers), min_size=1, max_size=max_owners, unique=True))
    sub_knobs = {**knobs, "max_depth": 0, "max_children": 3}
    owned: dict[str, Supervisor | Mesh] = {}
    for path in owners:
        if draw(st.booleans()):
            owned[path] = Mesh(
                "mesh",
                actor,
                shape={"procs": 2},
                intensity=draw(st.sampled_from(list(knobs.get("intensities", (0, 1, 2, 3))))),
                period=draw(st.sampled_from(list(knobs.get("periods", (3600.0,))))),
            )
        else:
            owned[path] = draw(supervision_trees(actor, root_id="sub", **sub_knobs))
    return _with_owners(tree, "", owned, owner), owned


def _with_owners(
    spec: Supervisor, parent: str, owned: dict[str, Supervisor | Mesh], owner: type | str
) -> Supervisor:
    """`spec` with the worker at each path of `owned` made an `owner` given its subtree."""
    path = f"{parent}/{spec.id}" if parent else spec.id
    children: list[Any] = []
    for child in spec.children:
        at = f"{path}/{child.id}"
        if isinstance(child, Supervisor):
            child = _with_owners(child, path, owned, owner)
        elif isinstance(child, Worker) and at in owned:
            child = dataclasses.replace(child, actor=owner, args=(owned[at],))
        children.append(child)
    return dataclasses.replace(spec, children=children)


def tree_paths(tree: Supervisor) -> tuple[list[str], list[tuple[str, Supervisor]]]:
    """The worker paths and the (path, spec) of every supervisor of `tree`."""
    workers, sups = [], []
    for path, spec in walk(tree):
        if isinstance(spec, Worker):
            workers.append(path)
        elif isinstance(spec, Supervisor):
            sups.append((path, spec))
    return workers, sups


@st.composite
def fault_step(
    draw: st.DrawFn,
    tree: Supervisor,
    actor: type | str | None = None,
    *,
    reasons: Sequence[object] = REASONS,
    stops: bool = True,
    calls: bool = True,
    advances: Sequence[float] = (),
) -> Step:
    """One step: a worker exits with a reason, a supervisor is stopped, a dynamic-children
    request, or the clock moves on."""
    workers, sups = tree_paths(tree)
    kinds = (
        ["crash"] * 5
        + ["stop"] * stops
        + ["call"] * (3 * calls)
        + ["advance"] * (2 * bool(advances))
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "crash":
        dynamic = [f"{path}/dyn" for path, _ in sups] if calls else []
        return Crash(draw(st.sampled_from(workers + dynamic)), draw(st.sampled_from(list(reasons))))
    if kind == "advance":
        return Advance(draw(st.sampled_from(list(advances))))
    path, spec = draw(st.sampled_from(sups))
    if kind == "stop":
        return StopSupervisor(path, draw(st.sampled_from(list(STOP_REASONS))))
    op: CallOp = draw(
        st.sampled_from(["start_child", "terminate_child", "restart_child", "delete_child"])
    )
    child_id = draw(st.sampled_from([c.id for c in spec.children] + ["dyn"]))
    if op == "start_child":
        restart = draw(st.sampled_from([PERMANENT, TRANSIENT, TEMPORARY]))
        child_actor: Any = actor if actor is not None else _actor_of(tree)
        return Call(path, op, spec=Worker(child_id, child_actor, restart=restart, shutdown=1.0))
    return Call(path, op, id=child_id)


def fault_schedules(
    tree: Supervisor,
    actor: type | str | None = None,
    *,
    min_steps: int = 1,
    max_steps: int = 8,
    reasons: Sequence[object] = REASONS,
    stops: bool = True,
    calls: bool = True,
    advances: Sequence[float] = (),
) -> st.SearchStrategy[list[Step]]:
    """Lists of steps for `tree` (see ``fault_step``)."""
    step = fault_step(tree, actor, reasons=reasons, stops=stops, calls=calls, advances=advances)
    return st.lists(step, min_size=min_steps, max_size=max_steps)


def _actor_of(tree: Supervisor) -> type | str:
    for _, spec in walk(tree):
        if isinstance(spec, Worker):
            return spec.actor
    return "otpmesh:Actor"


__all__ = [
    "REASONS",
    "STOP_REASONS",
    "Advance",
    "Call",
    "Crash",
    "StopSupervisor",
    "fault_schedules",
    "fault_step",
    "owned_trees",
    "supervision_trees",
    "tree_paths",
]
