"""What the simulator (_simulate.py) keeps of each running supervisor and worker."""

from __future__ import annotations

from dataclasses import dataclass

from .._core._supervisor import SupervisorCore


@dataclass(slots=True)
class SimNode:
    core: SupervisorCore
    parent: SimNode | None
    id: str
    incarnation: int
    owner: str | None = None  # an owned subtree's root: the worker that started it


@dataclass(slots=True)
class Running:
    parent: SimNode
    id: str
    incarnation: int
