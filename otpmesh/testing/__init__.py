"""Test helpers for otpmesh users: a pure simulator of supervision trees (the reference model)
and hypothesis strategies for trees and fault schedules.

``simulate(tree, steps)`` runs a tree of supervisor cores with idealised children and a scripted
fault schedule, and returns its trace and event log; no processes, no clock, microseconds a run.
"""

from ._simulate import Advance as Advance
from ._simulate import Call as Call
from ._simulate import Crash as Crash
from ._simulate import Simulation as Simulation
from ._simulate import StartOutcome as StartOutcome
from ._simulate import Step as Step
from ._simulate import StopSupervisor as StopSupervisor
from ._simulate import TraceEntry as TraceEntry
from ._simulate import simulate as simulate
from ._strategies import fault_schedules as fault_schedules
from ._strategies import supervision_trees as supervision_trees
from ._strategies import tree_paths as tree_paths
