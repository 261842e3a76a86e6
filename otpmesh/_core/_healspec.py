"""``Mesh(heal=...)``: how a restarted member of a mesh gets its state back before it serves.

A replica of a data-parallel or rollout mesh that is SIGKILLed comes back with what its
constructor made; its peers hold the state it lost. With ``heal``, the restarted member takes it
from a live peer (torchft's "heal from a live replica"), so no user code has to fetch weights by
hand and no caller ever sees the empty replica. The protocol is two methods on the actor class:

- ``state()``, an ``@endpoint``: the peer's state as a sendable value (dicts, lists, tensors;
  large tensors travel over the tensor channel). Being an endpoint, it is served in the peer's
  mailbox between two messages, so the snapshot is never taken halfway through an update.
- ``async def load_state(self, state)``: run in the new member after its constructor and
  ``on_start``, before its first message.

Checked here, when the spec is built (an actor given by import path is checked when it starts).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._spec_errors import SpecError

#: The endpoint a peer serves its state with, and the method a restarted member loads it with.
STATE = "state"
LOAD_STATE = "load_state"
#: The fallback that keeps what the constructor and ``on_start`` made.
CONSTRUCTOR = "constructor"
#: ``heal="peer"``: the shorthand for ``Heal()``.
PEER = "peer"

_HEAL_ALLOWED = "None, 'peer' or otpmesh.Heal(from_=..., fallback=..., timeout=...)"
_FROM_ALLOWED = "'peer', the path of another Mesh ('rl/dp_b'), or a tuple of them"
_FALLBACK_ALLOWED = "'constructor' or the name of an async method of the actor taking no arguments"


@dataclass(frozen=True, slots=True, kw_only=True)
class Heal:
    """How a restarted member of a Mesh takes its state from a live peer before it serves.

    ``from_`` says where peers are, in the order to ask them: ``"peer"``, this mesh's members
    that have been running since before the failure that restarted this one, lowest rank
    first; or the path of another Mesh of the same shape (``"rl/dp_b"``, a replica group of
    its own), whose member of the *same rank* is asked (it holds the same shard). If a peer's
    ``state()`` call fails (it died, raised or took longer than ``timeout`` seconds) the next
    is tried. When none is left (every member restarted together: ``ONE_FOR_ALL``, a process
    group, the whole mesh restarted by its parent) the ``fallback`` runs: ``"constructor"``
    keeps what the constructor and ``on_start`` made; the name of an async method of the actor
    (``"load_checkpoint"``) calls it with no arguments. The first start of a mesh heals
    nothing: the constructor's state is the state.
    """

    from_: str | tuple[str, ...] = PEER
    fallback: str = CONSTRUCTOR
    timeout: float = 60.0

    def __post_init__(self) -> None:
        where = "Heal"
        sources = (self.from_,) if isinstance(self.from_, str) else self.from_
        if (
            not isinstance(sources, tuple | list)
            or not sources
            or not all(isinstance(s, str) and s and not s.endswith("/") for s in sources)
        ):
            raise SpecError(where, "from_", self.from_, _FROM_ALLOWED)
        object.__setattr__(self, "from_", tuple(sources))
        if not isinstance(self.fallback, str) or not self.fallback.isidentifier():
            raise SpecError(where, "fallback", self.fallback, _FALLBACK_ALLOWED)
        t = self.timeout
        number = isinstance(t, int | float) and not isinstance(t, bool)
        if not (number and t > 0 and math.isfinite(t)):
            raise SpecError(where, "timeout", t, "a positive number of seconds (per peer asked)")
        object.__setattr__(self, "timeout", float(t))


def check_heal(path: str, value: object, actor: type | str) -> Heal | None:
    """``value`` as a Heal (or None), checked against the actor class when it is a class."""
    if value is None:
        return None
    if value == PEER:
        heal = Heal()
    elif isinstance(value, Heal):
        heal = value
    elif isinstance(value, Mapping):  # from config, or a spec that came over the wire
        try:
            heal = Heal(**value)
        except TypeError:
            raise SpecError(path, "heal", dict(value), _HEAL_ALLOWED) from None
    else:
        raise SpecError(path, "heal", value, _HEAL_ALLOWED)
    if isinstance(actor, type):
        problem = heal_problem(actor, heal.fallback)
        if problem is not None:
            raise SpecError(path, "heal", value, _HEAL_ALLOWED, problem)
    return heal


def heal_problem(cls: type, fallback: str) -> str | None:
    """Why actor class `cls` cannot heal (its methods say), or None. Also checked when an actor
    named by import path starts."""
    name = cls.__qualname__
    endpoints: dict[str, Any] = cls.endpoints() if hasattr(cls, "endpoints") else {}
    if STATE not in endpoints:
        return (
            f"{name} has no endpoint {STATE}(): a peer serves its state with it; add "
            f"'@otpmesh.endpoint def {STATE}(self) -> dict: ...' returning sendable values"
        )
    if not inspect.iscoroutinefunction(getattr(cls, LOAD_STATE, None)):
        return (
            f"{name} has no 'async def {LOAD_STATE}(self, state)': the restarted member loads "
            "its peer's state with it"
        )
    if fallback != CONSTRUCTOR and not inspect.iscoroutinefunction(getattr(cls, fallback, None)):
        return (
            f"{name} has no 'async def {fallback}(self)' for fallback={fallback!r}: name an "
            f"async method of the actor, or use fallback={CONSTRUCTOR!r}"
        )
    return None
