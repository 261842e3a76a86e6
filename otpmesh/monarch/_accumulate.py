"""Monarch's ``Accumulator`` and ``send``: reducing a mesh's replies, and the low-level send."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._future import Future
from ._meshes import Endpoint
from ._where import start

R = TypeVar("R")
A = TypeVar("A")


class Accumulator(Generic[R, A]):
    """Fold an endpoint's replies from every actor of its mesh into one value, in the order
    they arrive: ``Accumulator(mesh.ep, 0, operator.add).accumulate(x)``."""

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A]) -> None:
        # Anything with Monarch's stream() will do (a mesh's endpoint, or a stand-in in tests).
        if not callable(getattr(endpoint, "stream", None)):
            raise TypeError(
                f"Accumulator needs a mesh's endpoint (mesh.ep), which streams its replies; "
                f"{endpoint!r} has no stream()"
            )
        self._endpoint, self._identity, self._combine = endpoint, identity, combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call every actor with these arguments; the Future's value is the fold."""
        replies = list(self._endpoint.stream(*args, **kwargs))

        async def fold(ready: Callable[[], None]) -> A:
            ready()
            value = self._identity
            for reply in replies:
                value = self._combine(value, await reply)
            return value

        return start(fold)


def send(
    endpoint: Endpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Any = None,
    selection: str = "all",
) -> None:
    """Send a message to every actor of `endpoint`'s mesh (Monarch's low-level ``send``)."""
    if port is not None:
        raise NotImplementedError("send(port=...) is not supported yet")
    if selection != "all":
        raise NotImplementedError(
            f"send(selection={selection!r}): only 'all'; for one actor use .choose(...)"
        )
    endpoint.broadcast(*args, **kwargs)
