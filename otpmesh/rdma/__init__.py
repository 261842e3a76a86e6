"""The tensor channel: tensors move actor to actor by handle (otpmesh.rdma).

    buf = RDMABuffer(tensor)            # in the owner: register (a small handle, serializable)
    await peer.take(buf)                # the handle travels in a message
    await buf.read_into(local)          # in the peer: one-sided copy, owner's memory -> local
    await buf.write_from(local)         #                              local -> owner's memory
    buf.drop()                          # the owner releases it

Backends, best first: ``cuda_ipc`` (GPU tensors on one host; not in this build yet), ``shm``
(CPU tensors on one host, the kernel copies between the two processes), ``ibverbs`` (one-sided
RDMA through pyverbs, where an RDMA device exists), ``tcp`` (anywhere). ``backends()`` says what
this process can use; ``buf.backend`` says what a transfer used; OTPMESH_RDMA_BACKENDS (e.g.
"tcp" or "ibverbs,tcp") forces or forbids. A fallback from the first allowed backend is logged
once.
"""

from ._buffer import RDMABuffer as RDMABuffer
from ._error import RDMAError as RDMAError
from ._params import flat_parameters as flat_parameters
from ._preference import PREFERENCE as PREFERENCE
from ._preference import allowed_backends as allowed_backends
from ._registry import backends as backends
