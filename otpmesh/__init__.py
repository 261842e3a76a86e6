"""otpmesh: Erlang/OTP-style supervision for single-controller PyTorch programs.

Submodules: ``otpmesh.chaos`` (fault injection), ``otpmesh.testing`` (the reference model and
hypothesis strategies), ``otpmesh.bench`` (benchmarks).

The public API, curated: everything else lives in private modules.
"""

from . import chaos as chaos
from . import launchers as launchers
from ._controller._app import App as App
from ._controller._app import start as start
from ._controller._background import BackgroundApp as BackgroundApp
from ._controller._background import start_background as start_background
from ._controller._events import EventLog as EventLog
from ._controller._inspect import Stacks as Stacks
from ._controller._owned import Subtree as Subtree
from ._controller._owned import lookup as lookup
from ._controller._owned import singleton as singleton
from ._controller._procmesh import ProcMesh as ProcMesh
from ._controller._procmesh import proc_mesh as proc_mesh
from ._controller._procref import ProcMeshRef as ProcMeshRef
from ._controller._takeoverspec import Resumption as Resumption
from ._controller._takeoverspec import Takeover as Takeover
from ._core._actor import UNANSWERED as UNANSWERED
from ._core._actor import Actor as Actor
from ._core._actor import ActorContext as ActorContext
from ._core._actor import context as context
from ._core._actor import endpoint as endpoint
from ._core._actor import progress as progress
from ._core._children import ChildInfo as ChildInfo
from ._core._children import ChildStatus as ChildStatus
from ._core._errors import ActorDiedError as ActorDiedError
from ._core._errors import ActorError as ActorError
from ._core._errors import AppStoppedError as AppStoppedError
from ._core._errors import CallTimeoutError as CallTimeoutError
from ._core._errors import ChildError as ChildError
from ._core._errors import DeadlockError as DeadlockError
from ._core._errors import EncodeError as EncodeError
from ._core._errors import FencedError as FencedError
from ._core._errors import GroupError as GroupError
from ._core._errors import MeshError as MeshError
from ._core._errors import OtpmeshError as OtpmeshError
from ._core._errors import PortClosedError as PortClosedError
from ._core._errors import PortOverflowError as PortOverflowError
from ._core._errors import ProtocolError as ProtocolError
from ._core._errors import SingletonError as SingletonError
from ._core._errors import SpawnError as SpawnError
from ._core._errors import StaleEpochError as StaleEpochError
from ._core._errors import StandbyDoneError as StandbyDoneError
from ._core._errors import SupervisorError as SupervisorError
from ._core._errors import TakeoverError as TakeoverError
from ._core._exits import ActorCrash as ActorCrash
from ._core._exits import Hung as Hung
from ._core._exits import Ignore as Ignore
from ._core._exits import ProcessExit as ProcessExit
from ._core._exits import describe as describe
from ._core._healspec import Heal as Heal
from ._core._spec import ALL_FOR_ONE as ALL_FOR_ONE
from ._core._spec import ALL_SIGNIFICANT as ALL_SIGNIFICANT
from ._core._spec import ANY_SIGNIFICANT as ANY_SIGNIFICANT
from ._core._spec import BRUTAL_KILL as BRUTAL_KILL
from ._core._spec import ESCALATE as ESCALATE
from ._core._spec import INFINITY as INFINITY
from ._core._spec import NEVER as NEVER
from ._core._spec import ONE_FOR_ALL as ONE_FOR_ALL
from ._core._spec import ONE_FOR_ONE as ONE_FOR_ONE
from ._core._spec import PERMANENT as PERMANENT
from ._core._spec import REST_FOR_ONE as REST_FOR_ONE
from ._core._spec import TEMPORARY as TEMPORARY
from ._core._spec import TRANSIENT as TRANSIENT
from ._core._spec import Mesh as Mesh
from ._core._spec import Supervisor as Supervisor
from ._core._spec import Worker as Worker
from ._core._spec_errors import SpecError as SpecError
from ._core._supevents import LogEntry as LogEntry
from ._core._supevents import LogKind as LogKind
from ._core._supevents import Outcome as Outcome
from ._hosts._cluster import Cluster as Cluster
from ._hosts._clusterblock import cluster as cluster
from ._hosts._hostover import TakeoverHosts as TakeoverHosts
from ._node._failure import MeshFailure as MeshFailure
from ._node._future import Future as Future
from ._node._gather import gather as gather
from ._node._mesh import ActorMesh as ActorMesh
from ._node._mesh import ActorRef as ActorRef
from ._node._mesh import Endpoint as Endpoint
from ._node._mesh import Reduction as Reduction
from ._node._mesh import ValueMesh as ValueMesh
from ._node._ports import Channel as Channel
from ._node._ports import Port as Port
from ._node._ports import PortReceiver as PortReceiver
from ._node._retry import retry as retry
from ._runtime._pgmember import GroupInfo as GroupInfo
from ._runtime._pgmember import group as group
from ._runtime._run import run as run

__version__ = "0.1.0"
