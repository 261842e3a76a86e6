"""Two real nodes of this process, an owner and a reader, over a real Unix connection: the
set-up of the tensor-channel tests that drive both sides from one trio run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from otpmesh._node._node import Node, set_current_node
from otpmesh._wire._secret import new_app_secret
from otpmesh.rdma._channel import Channel


@asynccontextmanager
async def owner_and_reader() -> AsyncIterator[tuple[Node, Node]]:
    """Serve an owner and a reader node (one app's secret, each with a tensor channel) for the
    block, the owner current at its start; both stop when it ends."""
    secret = new_app_secret()
    owner = Node("owner", secret=secret, channel=Channel)
    reader = Node("reader", secret=secret, channel=Channel)
    async with trio.open_nursery() as nursery:
        await nursery.start(owner.serve)
        await nursery.start(reader.serve)
        set_current_node(owner)
        yield owner, reader
        nursery.cancel_scope.cancel()
