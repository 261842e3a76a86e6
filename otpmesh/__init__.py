"""otpmesh: Erlang/OTP-style supervision for single-controller PyTorch programs.

Submodules: ``otpmesh.chaos`` (fault injection), ``otpmesh.testing`` (the reference model and
hypothesis strategies), ``otpmesh.bench`` (benchmarks).

The public API, curated: everything else lives in private modules.
"""

from . import chaos as chaos
from . import launchers as launchers
from ._actor import Actor as Actor
from ._actor import ActorContext as ActorContext
from ._actor import context as context
from ._actor import endpoint as endpoint
from ._app import App as App
from ._app import start as start
from ._cluster import Cluster as Cluster
from ._cluster import cluster as cluster
from ._errors import ActorDiedError as ActorDiedError
from ._errors import ActorError as ActorError
from ._errors import CallTimeoutError as CallTimeoutError
from ._errors import ChildError as ChildError
from ._errors import EncodeError as EncodeError
from ._errors import MeshError as MeshError
from ._errors import OtpmeshError as OtpmeshError
from ._errors import ProtocolError as ProtocolError
from ._errors import SpawnError as SpawnError
from ._errors import SupervisorError as SupervisorError
from ._events import EventLog as EventLog
from ._exits import ActorCrash as ActorCrash
from ._exits import Ignore as Ignore
from ._exits import ProcessExit as ProcessExit
from ._exits import describe as describe
from ._mesh import ActorMesh as ActorMesh
from ._mesh import ActorRef as ActorRef
from ._mesh import Endpoint as Endpoint
from ._mesh import ValueMesh as ValueMesh
from ._procmesh import ProcMesh as ProcMesh
from ._procmesh import proc_mesh as proc_mesh
from ._retry import retry as retry
from ._run import run as run
from ._spec import ALL_FOR_ONE as ALL_FOR_ONE
from ._spec import ALL_SIGNIFICANT as ALL_SIGNIFICANT
from ._spec import ANY_SIGNIFICANT as ANY_SIGNIFICANT
from ._spec import BRUTAL_KILL as BRUTAL_KILL
from ._spec import ESCALATE as ESCALATE
from ._spec import INFINITY as INFINITY
from ._spec import NEVER as NEVER
from ._spec import ONE_FOR_ALL as ONE_FOR_ALL
from ._spec import ONE_FOR_ONE as ONE_FOR_ONE
from ._spec import PERMANENT as PERMANENT
from ._spec import REST_FOR_ONE as REST_FOR_ONE
from ._spec import TEMPORARY as TEMPORARY
from ._spec import TRANSIENT as TRANSIENT
from ._spec import Mesh as Mesh
from ._spec import Supervisor as Supervisor
from ._spec import Worker as Worker
from ._spec_errors import SpecError as SpecError
from ._supevents import LogEntry as LogEntry
from ._supevents import LogKind as LogKind
from ._supevents import Outcome as Outcome

__version__ = "0.1.0"
