"""Deadlocks refused: the chain of actors a call waits through.

An actor handles one message at a time, so while its endpoint waits on a call, the actor is
busy: a call back to it (directly, A -> A, or around a cycle, A -> B -> A) could never be
answered. Each call carries the chain of actors busy waiting on it; an actor's serial endpoint
runs with that chain plus itself, and a call to a serial endpoint of any actor already in the
chain fails at once with ``DeadlockError`` instead of hanging (OTP's ``gen_server:call``
refuses ``calling_self``).

The actor called decides (``ActorCell.refused``, as the call is delivered), because only it
knows which of its endpoints are concurrent: a concurrent endpoint's call runs beside whatever
keeps the actor busy, so a call into it is answered even from inside the chain (re-entrant
ping-pong), and its own calls carry its caller's chain without adding the actor, which it
does not keep busy.
"""

from __future__ import annotations

import contextvars

#: The actors busy waiting on the message the current task handles, oldest first (empty
#: outside actors: the controller's own calls wait on nothing that could call back).
CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "otpmesh_call_chain", default=()
)


#: How a refused call's cycle travels in its ERR frame (kind "deadlock"): its paths, joined.
CYCLE_JOIN = " -> "
