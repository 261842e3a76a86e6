"""Deadlocks refused: the chain of actors a call waits through.

An actor handles one message at a time, so while its endpoint waits on a call, the actor is
busy: a call back to it (directly, A -> A, or around a cycle, A -> B -> A) could never be
answered. Each call carries the chain of actors busy waiting on it; an actor's endpoint runs with
that chain plus itself, and a call to any actor already in the chain fails at once with
``DeadlockError`` instead of hanging (OTP's ``gen_server:call`` refuses ``calling_self``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

from .._core._errors import DeadlockError

#: The actors busy waiting on the message the current task handles, oldest first (empty
#: outside actors: the controller's own calls wait on nothing that could call back).
CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "otpmesh_call_chain", default=()
)


def check(chain: tuple[str, ...], targets: Sequence[str]) -> None:
    """Raise DeadlockError if a call from `chain` to any of `targets` would wait on itself."""
    for target in targets:
        if target in chain:
            raise DeadlockError([*chain[chain.index(target) :], target])
