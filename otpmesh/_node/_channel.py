"""What a node needs of its tensor channel: the interface, not the channel (otpmesh.rdma
implements it; the processes that run a node pass one in, so nothing is installed by an import).

Large values in ordinary calls travel by handle: the sender's node *offers* each one to its
channel when it packs a message, the receiving node *fetches* the ones a frame named before it
delivers the message, and the sender drops what it offered once the call is over (a cast's once
its targets have read it).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._wire._connection import Connection
    from .._wire._tensors import PendingTensor


class TensorChannel(Protocol):
    """A node's tensor channel, as the node uses it."""

    def offer(self, value: Any, collect: list[int] | None) -> Any:
        """Register a large `value` for readers (a tensor, or a flat byte memoryview: see
        ``_tensors.Offer``); its handle data (or None: send it inline). With `collect`, the
        buffer id is appended there: its sender releases it later."""

    def drop_offered(self, buffer_ids: list[int]) -> None:
        """A call ended: release the buffers its arguments were offered in."""

    def release_after(self, buffer_ids: list[int], readers: int) -> None:
        """A cast went to `readers` actors: release its buffers once each has read them."""

    def deliver_later(
        self, conn: Connection, msg: list[Any], pending: list[PendingTensor]
    ) -> Awaitable[None]:
        """Fetch the channel tensors of `msg` (from `conn`), then dispatch it; the connection's
        reader awaits this, so later frames wait and order is kept."""

    def fetch_local(self, value: Any, pending: list[PendingTensor]) -> Any:
        """`value` with its channel tensors copied out of this node's own buffers."""
