"""otpmesh: Erlang/OTP-style supervision for single-controller PyTorch programs.

The public API, curated: everything else lives in private modules.
"""

from ._actor import Actor as Actor
from ._actor import ActorContext as ActorContext
from ._actor import context as context
from ._actor import endpoint as endpoint
from ._errors import ActorDiedError as ActorDiedError
from ._errors import ActorError as ActorError
from ._errors import CallTimeoutError as CallTimeoutError
from ._errors import EncodeError as EncodeError
from ._errors import MeshError as MeshError
from ._errors import OtpmeshError as OtpmeshError
from ._errors import ProtocolError as ProtocolError
from ._errors import SpawnError as SpawnError
from ._mesh import ActorMesh as ActorMesh
from ._mesh import ActorRef as ActorRef
from ._mesh import Endpoint as Endpoint
from ._mesh import ValueMesh as ValueMesh
from ._procmesh import ProcMesh as ProcMesh
from ._procmesh import proc_mesh as proc_mesh
from ._run import run as run

__version__ = "0.1.0"
