"""The steps of a fault schedule, as the reference model (``simulate``) and the machines apply
them: a worker exits, a supervisor is stopped or killed, the clock moves, a dynamic-children
request. Any of them may name a path inside an owned subtree (``rl/svc/replicas/0``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._core._reasons import SHUTDOWN
from .._core._spec import ChildSpec

StartOutcome: TypeAlias = Literal["ok", "ignore"] | tuple[Literal["error"], object]
TraceEntry: TypeAlias = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Crash:
    """The running worker at `path` exits by itself with `reason` (skipped if not running)."""

    path: str
    reason: object = "crash"


@dataclass(frozen=True, slots=True)
class StopSupervisor:
    """The supervisor at `path` is stopped with `reason` (OTP's ``sys:terminate``)."""

    path: str
    reason: object = SHUTDOWN


@dataclass(frozen=True, slots=True)
class KillSupervisor:
    """The supervisor at `path` is killed (OTP's ``exit(Sup, kill)``, ``otpmesh.chaos.kill``):
    it and everything under it die at once with ``killed``; its parent sees the exit."""

    path: str


@dataclass(frozen=True, slots=True)
class Advance:
    """The clock moves on by `seconds`."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Call:
    """A dynamic-children request to the supervisor at `sup`: `op` is ``start_child`` (with
    `spec`) or ``terminate_child`` / ``restart_child`` / ``delete_child`` (with `id`)."""

    sup: str
    op: Literal["start_child", "terminate_child", "restart_child", "delete_child"]
    id: str = ""
    spec: ChildSpec | None = None


@dataclass(frozen=True, slots=True)
class Takeover:
    """The controller dies and a standby takes the running tree over from its journal (the
    reference model's ``Simulation`` only): each supervisor's child list is rebuilt as the
    journal kept it, what runs is adopted, and the workers at `lost` (each running when the
    controller died) died while none ran: their exits, with `reason`, are reported once the
    tree is resumed, in that order. OTP, which has no controller, sees only those exits."""

    lost: tuple[str, ...] = ()
    reason: object = "killed"


Step: TypeAlias = Crash | StopSupervisor | KillSupervisor | Advance | Call
ModelStep: TypeAlias = Step | Takeover
"""What the reference model applies: a fault schedule's steps, and takeovers."""
