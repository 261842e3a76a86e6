"""Test helpers for otpmesh users: a pure simulator of supervision trees (the reference model),
hypothesis strategies for trees and fault schedules, ``SupervisionMachine`` (property-based fault
testing of a running tree against the model) and a pytest plugin (fixtures ``run_app`` and
``chaos_seed``, the ``chaos`` marker, event logs in failure reports).

``simulate(tree, steps)`` runs a tree of supervisor cores with idealised children and a scripted
fault schedule, and returns its trace and event log; no processes, no clock, microseconds a run.

The strategies and the machine need hypothesis (``pip install 'otpmesh[test]'``); they are
imported on first use, so the pytest plugin, which lives here, loads without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._simulate import Simulation as Simulation
from ._simulate import simulate as simulate
from ._steps import Advance as Advance
from ._steps import Call as Call
from ._steps import Crash as Crash
from ._steps import KillSupervisor as KillSupervisor
from ._steps import StartOutcome as StartOutcome
from ._steps import Step as Step
from ._steps import StopSupervisor as StopSupervisor
from ._steps import TraceEntry as TraceEntry

if TYPE_CHECKING:
    from ._faults import FAULTS as FAULTS
    from ._faults import HANG_FAULTS as HANG_FAULTS
    from ._machine import SupervisionMachine as SupervisionMachine
    from ._strategies import fault_schedules as fault_schedules
    from ._strategies import owned_trees as owned_trees
    from ._strategies import supervision_trees as supervision_trees
    from ._strategies import tree_paths as tree_paths

# Names that need hypothesis, and the private module each lives in.
_LAZY = {
    "FAULTS": "_faults",
    "HANG_FAULTS": "_faults",
    "SupervisionMachine": "_machine",
    "fault_schedules": "_strategies",
    "owned_trees": "_strategies",
    "supervision_trees": "_strategies",
    "tree_paths": "_strategies",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'otpmesh.testing' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ModuleNotFoundError as exc:
        if exc.name != "hypothesis":
            raise
        raise ImportError(
            f"otpmesh.testing.{name} needs hypothesis: pip install 'otpmesh[test]' "
            "(or pip install hypothesis)"
        ) from exc


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
