"""Supervision-tree specs: frozen dataclasses with OTP's words and defaults, checked up front.

A tree is data: building one starts nothing. Every field is validated in ``__post_init__`` so a
mistake is reported where it was written, naming the child path, the field, the value given and
the values allowed (OTP's ``check_childspec`` does the same before it starts anything).
A spec only knows its own id, so a field error inside a child names that child; checks that need
the parent (duplicate ids, ``significant`` under ``auto_shutdown=NEVER``) name the full path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from ._actor import Actor
from ._healspec import Heal, check_heal
from ._sendable import WHAT_TRAVELS, first_unsendable, why_not
from ._spec_errors import SpecError
from ._spec_fields import (
    as_word,
    check_child_flags,
    check_deadline,
    check_group_flags,
    check_id,
    check_shape,
    set_field,
)
from ._spec_words import ALL_FOR_ONE as ALL_FOR_ONE
from ._spec_words import ALL_SIGNIFICANT as ALL_SIGNIFICANT
from ._spec_words import ANY_SIGNIFICANT as ANY_SIGNIFICANT
from ._spec_words import BRUTAL_KILL as BRUTAL_KILL
from ._spec_words import ESCALATE as ESCALATE
from ._spec_words import INFINITY as INFINITY
from ._spec_words import NEVER as NEVER
from ._spec_words import ONE_FOR_ALL as ONE_FOR_ALL
from ._spec_words import ONE_FOR_ONE as ONE_FOR_ONE
from ._spec_words import PERMANENT as PERMANENT
from ._spec_words import REST_FOR_ONE as REST_FOR_ONE
from ._spec_words import TEMPORARY as TEMPORARY
from ._spec_words import TRANSIENT as TRANSIENT
from ._spec_words import AutoShutdown as AutoShutdown
from ._spec_words import Restart as Restart
from ._spec_words import Shutdown as Shutdown
from ._spec_words import ShutdownSpec as ShutdownSpec
from ._spec_words import Strategy as Strategy

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


#: How long an actor's start (constructor, ``on_start``) may take by default: loading a large
#: model from disk takes minutes; a start that takes longer says so (``start_timeout=``).
START_TIMEOUT = 600.0


def _check_args(path: str, spec: Worker | Mesh) -> None:
    if isinstance(spec.actor, str):
        if not _IMPORT_PATH.match(spec.actor):
            raise SpecError(path, "actor", spec.actor, _ACTOR_ALLOWED)
    elif not isinstance(spec.actor, type):
        raise SpecError(path, "actor", spec.actor, _ACTOR_ALLOWED)
    elif not issubclass(spec.actor, Actor):
        raise SpecError(
            path, "actor", spec.actor, _ACTOR_ALLOWED, "it does not subclass otpmesh.Actor"
        )
    if not isinstance(spec.args, tuple | list):
        raise SpecError(path, "args", spec.args, "a tuple or list of positional arguments")
    set_field(spec, "args", tuple(spec.args))
    kwargs = spec.kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise SpecError(path, "kwargs", kwargs, "a mapping of str to argument values")
    # A private copy behind a read-only view: the caller's dict can change, the spec cannot.
    set_field(spec, "kwargs", MappingProxyType(dict(kwargs)))
    # Code, not data, is refused here; specs are data (an owner given the subtree it starts).
    unsendable = first_unsendable(spec.args, spec.kwargs, also=(Supervisor, Worker, Mesh))
    if unsendable is not None:
        where, value = unsendable
        raise SpecError(path, where, value, WHAT_TRAVELS, why_not(value))


_ACTOR_ALLOWED = "an otpmesh.Actor subclass or its import path 'pkg.module:Class'"


@dataclass(frozen=True, slots=True)
class Worker:
    """One actor, started with ``actor(*args, **kwargs)`` and supervised as one child.

    ``actor`` is the class itself (an ``otpmesh.Actor`` subclass) or its import path
    ``"pkg.module:Class"``. ``args`` and ``kwargs`` travel to the actor's process, so they must be
    data: a function, a class or an open file among them is refused here, naming it. The defaults
    are OTP's for a worker: ``restart=PERMANENT``, ``shutdown=5.0`` seconds, ``significant=False``.
    ``progress_deadline`` (seconds, default none): how long one endpoint, or its start (the
    constructor, ``on_start``), may run without progress (``otpmesh.progress()``) before the
    actor exits as hung (docs/supervision.md). ``start_timeout`` (seconds, default 600: time to
    load a large model; None: none): how long its start may take in all, progress or not;
    past it the start fails as hung, with its stack.
    """

    id: str
    actor: type | str
    _: KW_ONLY
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    restart: Restart = Restart.PERMANENT
    shutdown: ShutdownSpec = 5.0
    significant: bool = False
    progress_deadline: float | None = None
    start_timeout: float | None = START_TIMEOUT

    def __post_init__(self) -> None:
        path = f"Worker {check_id('Worker', self.id)!r}"
        _check_args(path, self)
        check_child_flags(path, self)
        set_field(self, "progress_deadline", check_deadline(path, self.progress_deadline))
        set_field(self, "start_timeout", check_deadline(path, self.start_timeout, "start_timeout"))


@dataclass(frozen=True, slots=True)
class Supervisor:
    """A supervisor and its children, started in list order and stopped in reverse order.

    OTP's defaults: ``ONE_FOR_ONE``, ``intensity=1`` restart per ``period=5.0`` seconds,
    ``auto_shutdown=NEVER``. As a child, a supervisor is ``PERMANENT`` with ``shutdown=INFINITY``
    (OTP's advice: its subtree must be given all the time it needs to stop in order).
    ``parallel_shutdown=True`` (otpmesh's addition; a Mesh's group has it) terminates a set of
    children all at once, each with its own shutdown spec, as OTP's ``simple_one_for_one`` does,
    instead of one at a time in reverse start order.
    """

    id: str
    _: KW_ONLY
    strategy: Strategy = Strategy.ONE_FOR_ONE
    intensity: int = 1
    period: float = 5.0
    auto_shutdown: AutoShutdown = AutoShutdown.NEVER
    children: Sequence[Supervisor | Worker | Mesh] = ()
    restart: Restart = Restart.PERMANENT
    shutdown: ShutdownSpec = Shutdown.INFINITY
    significant: bool = False
    parallel_shutdown: bool = False

    def __post_init__(self) -> None:
        path = f"Supervisor {check_id('Supervisor', self.id)!r}"
        check_group_flags(path, self)
        if not isinstance(self.parallel_shutdown, bool):
            raise SpecError(path, "parallel_shutdown", self.parallel_shutdown, "True or False")
        set_field(
            self, "auto_shutdown", as_word(path, "auto_shutdown", self.auto_shutdown, AutoShutdown)
        )
        check_child_flags(path, self)
        children: object = self.children
        if isinstance(children, str | bytes) or not isinstance(children, Iterable):
            raise SpecError(path, "children", self.children, "a list of Supervisor/Worker/Mesh")
        set_field(self, "children", tuple(self.children))
        seen: set[str] = set()
        for child in self.children:
            check_sibling(self, child, seen)
            seen.add(child.id)


def check_sibling(parent: Supervisor, child: object, taken: set[str] | frozenset[str]) -> None:
    """The checks a child needs its parent for; also used by start_child.

    OTP rules 2 and 3 (docs/otp-rules.md).
    """
    if not isinstance(child, Supervisor | Worker | Mesh):
        raise SpecError(
            f"Supervisor {parent.id!r}", "children", child, "Supervisor, Worker or Mesh specs"
        )
    path = f"{type(child).__name__} '{parent.id}/{child.id}'"
    if child.id in taken:
        raise SpecError(path, "id", child.id, "an id no sibling uses", "duplicate child id")
    if child.significant and parent.auto_shutdown is AutoShutdown.NEVER:
        raise SpecError(
            path,
            "significant",
            True,
            "False under a supervisor with auto_shutdown=NEVER",
            "set auto_shutdown=ANY_SIGNIFICANT or ALL_SIGNIFICANT on the parent",
        )


@dataclass(frozen=True, slots=True)
class Mesh:
    """An actor mesh supervised as a group: one actor per slot of ``shape``.

    It behaves exactly as ``as_supervisor()``: a supervisor with ``strategy``, ``intensity`` and
    ``period`` whose children are ``PERMANENT`` workers ``"0"``, ``"1"``, ... in flat (row-major)
    rank order. ``shutdown``, ``progress_deadline`` and ``start_timeout`` are each actor's (as
    a ``Worker``'s: its start is under both); ``restart`` and
    ``significant`` are the group's, as a child of its parent (the group itself stops with
    ``INFINITY``, like any supervisor).
    ``process_group`` (``"gloo"`` or ``"nccl"``; default none) makes the actors one
    ``torch.distributed`` group, formed afresh under a new epoch at every (re)start of the
    group (docs/process-groups.md); it needs ``ONE_FOR_ALL`` or ``ESCALATE``.
    ``heal`` (``"peer"`` or ``otpmesh.Heal(...)``; default none): a restarted actor takes its
    state from a live peer of the mesh before it serves (docs/supervision.md, "Healing from a
    peer").
    Its actors are stopped all at once, as OTP's
    ``simple_one_for_one`` stops its children (``parallel_shutdown``): stopping a mesh takes
    one actor's shutdown time, not one per actor.
    """

    id: str
    actor: type | str
    _: KW_ONLY
    shape: Mapping[str, int] = field(default_factory=lambda: {"procs": 1})
    strategy: Strategy = Strategy.ONE_FOR_ONE
    intensity: int = 1
    period: float = 5.0
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    restart: Restart = Restart.PERMANENT
    shutdown: ShutdownSpec = 5.0
    significant: bool = False
    progress_deadline: float | None = None
    start_timeout: float | None = START_TIMEOUT
    process_group: str | None = None
    heal: Heal | str | None = None

    def __post_init__(self) -> None:
        path = f"Mesh {check_id('Mesh', self.id)!r}"
        check_group_flags(path, self)
        _check_args(path, self)
        check_child_flags(path, self)
        set_field(self, "progress_deadline", check_deadline(path, self.progress_deadline))
        set_field(self, "start_timeout", check_deadline(path, self.start_timeout, "start_timeout"))
        set_field(self, "shape", MappingProxyType(check_shape(path, self.shape)))
        _check_process_group(path, self)
        set_field(self, "heal", check_heal(path, self.heal, self.actor))

    @property
    def size(self) -> int:
        """The number of slots (actors): the product of the shape's sizes."""
        return math.prod(self.shape.values())

    def as_supervisor(self) -> Supervisor:
        """The equivalent Supervisor spec: what the supervisor core actually runs."""
        workers = [
            Worker(
                str(rank),
                self.actor,
                args=self.args,
                kwargs=self.kwargs,
                restart=Restart.PERMANENT,
                shutdown=self.shutdown,
                progress_deadline=self.progress_deadline,
                start_timeout=self.start_timeout,
            )
            for rank in range(self.size)
        ]
        return Supervisor(
            self.id,
            strategy=self.strategy,
            intensity=self.intensity,
            period=self.period,
            children=workers,
            restart=self.restart,
            shutdown=Shutdown.INFINITY,
            significant=self.significant,
            parallel_shutdown=True,
        )


PROCESS_GROUP_BACKENDS = ("gloo", "nccl")


def _check_process_group(path: str, spec: Mesh) -> None:
    """A process group is one communicator: its members restart together or not at all."""
    backend = spec.process_group
    if backend is None:
        return
    if backend not in PROCESS_GROUP_BACKENDS:
        raise SpecError(path, "process_group", backend, "None, 'gloo' or 'nccl'")
    if spec.strategy in (Strategy.ONE_FOR_ONE, Strategy.REST_FOR_ONE):
        raise SpecError(
            path,
            "strategy",
            spec.strategy.value,
            "ONE_FOR_ALL (or ESCALATE) for a Mesh with process_group",
            "a torch.distributed group cannot admit a replacement rank: when one member "
            "fails the others are stuck in its collectives, so every member must be restarted "
            "into a new group; use strategy=ONE_FOR_ALL",
        )


ChildSpec: TypeAlias = Supervisor | Worker | Mesh
"""Anything that can be a child of a Supervisor."""


def as_core_spec(spec: ChildSpec) -> Supervisor | Worker:
    """A Mesh becomes its equivalent Supervisor; the supervisor core knows only these two."""
    return spec.as_supervisor() if isinstance(spec, Mesh) else spec


def walk(spec: ChildSpec, parent: str = "") -> Iterator[tuple[str, ChildSpec]]:
    """Every node of a tree with its path, parents first, children in start order.

    Paths join ids with '/': ``rl``, ``rl/learner``, ``rl/rollouts``, ``rl/rollouts/2``. A Mesh is
    yielded itself, then its slot workers.
    """
    path = f"{parent}/{spec.id}" if parent else spec.id
    yield path, spec
    children = spec.as_supervisor().children if isinstance(spec, Mesh) else ()
    if isinstance(spec, Supervisor):
        children = spec.children
    for child in children:
        yield from walk(child, path)
