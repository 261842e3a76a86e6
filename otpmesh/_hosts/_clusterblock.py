"""The ``async with otpmesh.cluster(launcher)`` block: listen, start the agents, wait for them,
attach their hosts (a ``Cluster``, _cluster.py) to the controller runtime, and stop it all."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from .._core._errors import SpawnError
from .._runtime._controller_runtime import runtime
from .._wire._secret import load_secret
from ._cluster import REGISTER_TIMEOUT, Cluster
from ._launcher import Launcher


@asynccontextmanager
async def cluster(
    launcher: Launcher,
    *,
    listen: str = "127.0.0.1",
    port: int = 0,
    advertise: str | None = None,
    relocate: bool = True,
    timeout: float = REGISTER_TIMEOUT,
) -> AsyncIterator[Cluster]:
    """Start host agents with `launcher`, wait until they register, and run meshes on them.

    The controller listens on `listen`:`port` (loopback unless told otherwise; ``0.0.0.0`` for a
    real cluster, with `advertise` the address agents dial). Inside the block a mesh slot's
    ``hosts`` coordinate picks its host. On exit every agent and worker is stopped.
    """
    rt = await runtime()
    if rt.cluster is not None:
        raise SpawnError("a cluster is already attached to this controller")
    rt.node.tcp_secret = load_secret(create=True)
    bound = await rt.node.listen_tcp(listen, port)
    if advertise is None and listen in ("0.0.0.0", "::"):
        advertise = socket.gethostname()  # a wildcard is no address to dial
    address = bound if advertise is None else f"tcp:{advertise}:{bound.rpartition(':')[2]}"
    hosts = Cluster(rt, relocate=relocate)
    hosts.address = address
    hosts.launcher = launcher
    rt.cluster = hosts
    watching = trio.CancelScope()

    async def watch() -> None:
        with watching:
            await hosts.watch()

    assert rt.nursery is not None
    rt.nursery.start_soon(watch)
    # Made before any agent is started, so that none registers before they are expected.
    agent_tokens = getattr(launcher, "agent_tokens", None)  # a launcher that can give them
    if agent_tokens is not None:
        hosts.tokens = dict(agent_tokens())
    try:
        await launcher.start(address, rt.node.tcp_secret)
        await hosts.wait_for(launcher, timeout)
        yield hosts
    finally:
        with trio.CancelScope(shield=True):
            await hosts.shutdown()
            await launcher.stop()
        watching.cancel()
        rt.cluster = None
        rt.node.stop_tcp()
