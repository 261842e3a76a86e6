"""Monarch's actor API on otpmesh: change ``from monarch.actor import ...`` to
``from otpmesh.monarch import ...`` and a Monarch program runs here, with Monarch's semantics
(an endpoint's error goes back to its caller, ``.get()`` and ``await`` on every result), and
otpmesh under it (supervision trees, chaos, stacks, the live view).

docs/guides/from-monarch.md lists what carries over, what differs and why.
"""

from .._core._errors import ActorError as ActorError
from .._node._failure import MeshFailure as MeshFailure
from ._accumulate import Accumulator as Accumulator
from ._accumulate import send as send
from ._actor import Actor as Actor
from ._actor import Context as Context
from ._actor import Instance as Instance
from ._actor import concurrent_endpoint as concurrent_endpoint
from ._actor import context as context
from ._actor import current_actor_name as current_actor_name
from ._actor import current_rank as current_rank
from ._actor import current_size as current_size
from ._actor import endpoint as endpoint
from ._faults import default_hook
from ._future import Future as Future
from ._hosts import HostMesh as HostMesh
from ._hosts import get_or_spawn_controller as get_or_spawn_controller
from ._hosts import this_host as this_host
from ._hosts import this_proc as this_proc
from ._meshes import ActorMesh as ActorMesh
from ._meshes import Endpoint as Endpoint
from ._meshes import ProcMesh as ProcMesh
from ._ports import Channel as Channel
from ._ports import Port as Port
from ._ports import PortReceiver as PortReceiver
from ._supervision import SupervisionError as SupervisionError
from ._values import Extent as Extent
from ._values import Point as Point
from ._values import ValueMesh as ValueMesh
from ._where import shutdown_context as shutdown_context

#: Called with a MeshFailure when a mesh this program spawned fails and nobody handles it
#: (Monarch's hook; its default ends the program). Replace it to log or ignore instead.
unhandled_fault_hook = default_hook

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
