"""Asking the app's controller for something only it can do (start processes, stop a mesh,
look an actor up): from a worker over its controller connection, in the controller directly."""

from __future__ import annotations

from typing import Any

from .._core._errors import MeshError
from ._node import Node, current_node


def this_node() -> Node:
    node = current_node()
    if node is None:
        raise MeshError(
            "no otpmesh node is running in this trio run: start an app (otpmesh.start or "
            "otpmesh.proc_mesh) in the controller, or call this from inside an actor"
        )
    return node


def in_controller() -> bool:
    """Whether this trio run is the controller's (not a worker's)."""
    node = current_node()
    return node is not None and node.parent is None


async def ask_controller(op: str, payload: Any) -> Any:
    """Run the controller's node operation `op` (registered by the layer that serves it) and
    return its answer; its errors are raised here as they are for any node operation."""
    node = this_node()
    if node.parent is not None:
        return await node.sys_call(node.parent, op, payload, f"controller:{op}")
    handler = node.sys_handlers.get(op)
    if handler is None:
        raise MeshError(f"this process runs no otpmesh app that can {op.replace('_', ' ')}")
    return await handler(None, payload)
