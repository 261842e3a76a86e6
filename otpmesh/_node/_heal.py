"""Healing a restarted actor from a live peer, inside its start (``Mesh(heal=...)``).

The controller picks the peers and their order (_controller/_healpeers.py) and sends them with
the start; the new actor asks each in turn for its ``state()`` over an ordinary call (large
tensors come over the tensor channel, as in any reply), straight from the peer's process to
its own, then loads it. It all happens before the actor's cell exists and before its slot is
marked up, so no call can reach it half-loaded: callers wait, as for any restart. A failure of
``load_state`` or of the fallback is a start failure, handled by the supervisor's usual rules.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .._core._errors import OtpmeshError
from .._core._healspec import CONSTRUCTOR, LOAD_STATE, STATE
from .._core._signature import Endpoints
from ._mesh import ActorRef
from ._slot import Slot

log = logging.getLogger("otpmesh.heal")

#: Runs one of the actor's coroutines on the loop its code runs on (trio or asyncio).
RunHook = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]


async def heal(me: str, instance: Any, plan: dict[str, Any], run: RunHook) -> str:
    """Load a peer's state into `instance` (the actor at `me`, constructed and started), or run
    the plan's fallback when no peer answers. Returns what it healed from: a peer's path, or
    the fallback."""
    for path, addr in plan["peers"]:
        found, state = await _state_of(me, path, addr, plan["timeout"])
        if found:
            await run(getattr(instance, LOAD_STATE)(state))
            log.info("%s healed from %s", me, path)
            return str(path)
    fallback = str(plan["fallback"])
    if fallback != CONSTRUCTOR:
        await run(getattr(instance, fallback)())
    log.info("%s: no peer to heal from; fallback %s", me, fallback)
    return fallback


async def _state_of(me: str, path: str, addr: str, timeout: float) -> tuple[bool, Any]:
    """(True, its state), or (False, None) when the peer cannot give it: it is gone, dies on
    the way, raised or is too slow. Not supervised here: a dead peer fails at once, never
    waits for its restart (the next peer is asked instead)."""
    ref = ActorRef(path, Endpoints({}), Slot(path, addr), timeout)
    try:
        return True, await ref.endpoint(STATE).call_one()
    except (OtpmeshError, OSError) as exc:
        log.warning("%s: peer %s could not give its state (%s); trying the next", me, path, exc)
        return False, None
