"""Broadcast as a tree: controller -> host agent -> that host's workers (the caller's side; the
agent's is _relay.py).

A call to several actors on one agent host costs the caller one frame to that host's agent, not
one per actor: a SYS ``fanout`` cast carrying the call body once, the target actors and a call id
for each, allocated on the caller's connection to the agent. The agent relays the call to each
worker on its host and sends every reply back on that connection under the caller's call id, so
the caller's reply handling is unchanged. A caller that gives up sends the agent a CANCEL for
its call id, which the agent relays to the worker under its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .._wire import _codec
from .._wire._connection import Connection
from .._wire._frames import CANCEL
from ._calls import Target

#: Fewer targets than this on one host go direct: relaying one call would only add a hop.
MIN_FANOUT = 2


def plan(relays: dict[str, Connection], targets: Sequence[Target]) -> dict[Connection, list[int]]:
    """Target indices to relay, by agent connection (hosts with at least MIN_FANOUT targets)."""
    by_agent: dict[Connection, list[int]] = {}
    for index, target in enumerate(targets):
        agent = relays.get(target.addr)
        if agent is not None and not agent.closed and target.dead_reason() is None:
            by_agent.setdefault(agent, []).append(index)
    return {agent: idx for agent, idx in by_agent.items() if len(idx) >= MIN_FANOUT}


def _cancel(conn: Connection, call_id: int, actor_id: str, forget: Callable[[], object]) -> None:
    forget()
    if not conn.closed:
        conn.send_nowait(_codec.pack([CANCEL, call_id, actor_id]))


def request(
    agent: Connection,
    group: Any,
    indices: list[int],
    targets: Any,
    body: bytes,
    chain: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The payload of the ``fanout`` cast to `agent` for the targets at `indices` of a call
    `group`: their replies are expected on `agent`'s connection from now on."""
    ids = []
    for index in indices:
        call_id = agent.expect_reply(group, index)
        # A caller that gives up tells the agent, which tells the worker (Relay.cancel).
        forget = group.cancels[index]
        group.cancels[index] = partial(_cancel, agent, call_id, targets[index].actor_id, forget)
        ids.append(call_id)
    return {
        "ids": ids,
        "actors": [targets[i].actor_id for i in indices],
        "addrs": [targets[i].addr for i in indices],
        "body": body,
        "chain": list(chain),
    }
