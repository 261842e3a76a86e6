"""What a BaseException raised by an actor's own code does (constructor, ``on_start``,
endpoints, ``on_stop``).

An ``Exception`` crashes the actor ("let it crash"). So does any other BaseException the
actor's code raises (``KeyboardInterrupt``, ``GeneratorExit``, a ``BaseException`` subclass):
it ends that actor only, never its process and the other actors in it. Two kinds pass through
instead, because they are not the actor's: trio's ``Cancelled``, which is how the runtime stops
an actor (a kill, a crash from outside, a caller that gave up), and, in the controller's own
process, ``KeyboardInterrupt``, which there is the user's Ctrl-C (a worker ignores SIGINT, so
there a ``KeyboardInterrupt`` can only come from the actor's code). ``SystemExit`` ends the actor
as a process would end: ``sys.exit()`` and ``sys.exit(0)`` stop it normally, any other code is a
crash (``_core/_exits.py``, ``ended_by``).
"""

from __future__ import annotations

import trio

#: What passes through actor code in a worker process: only the runtime's cancellation.
IN_WORKER: tuple[type[BaseException], ...] = (trio.Cancelled,)
#: What passes through actor code in the controller's own process (``placement="local"``).
IN_CONTROLLER: tuple[type[BaseException], ...] = (trio.Cancelled, KeyboardInterrupt)


def split(
    exc: BaseException, passing: tuple[type[BaseException], ...]
) -> tuple[BaseException | None, BaseException | None]:
    """(what must go on being raised, what the actor's code raised) of `exc`; either may be
    None. A group (a nursery in an endpoint) is split by its leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(passing)
    if isinstance(exc, passing):
        return exc, None
    return None, exc
