"""Retrying idempotent calls across restarts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from .._core._errors import ActorDiedError, CallTimeoutError
from ._ports import Port

T = TypeVar("T")

#: What "the actor died or did not answer" looks like to a caller.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ActorDiedError, CallTimeoutError)


async def retry(
    call: Callable[..., Awaitable[T]],
    *args: Any,
    attempts: int = 5,
    backoff: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    **kwargs: Any,
) -> T:
    """Await ``call(*args, **kwargs)``; when it fails because its actor died or did not answer,
    try again (up to `attempts` times in all, waiting `backoff` seconds, doubling), so a call
    that met a restart gets its answer from the next incarnation.

    Only for idempotent calls: a call that reached its actor before the actor died may already
    have had its effect. An endpoint's own exception (``ActorError``) is never retried.

    A streamed call is retried only before its first item: when a ``Port`` among the arguments
    (top level) has a receiver in this process that got values during the failed attempt, the
    error is raised, not retried (a retry would send them again), with a note saying how many
    arrived; pass that count to an endpoint that can resume from it.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    ports = [a for a in (*args, *kwargs.values()) if isinstance(a, Port)]
    delay = backoff
    for attempt in range(1, attempts + 1):
        before = [port.received_here() for port in ports]
        try:
            return await call(*args, **kwargs)
        except retry_on as exc:
            if attempt == attempts:
                raise
            # After the pause: what the dead attempt sent before it died has been read by then
            # (it came before the death on its own connection).
            await trio.sleep(delay)
            streamed = _streamed(ports, before)
            if streamed:
                exc.add_note(
                    f"otpmesh.retry did not try again: this attempt (number {attempt}) had "
                    f"already streamed {streamed}, and another would send them again"
                )
                raise
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def _streamed(ports: list[Port[Any]], before: list[int | None]) -> str:
    """What reached the receivers of `ports` since `before` (their counts), in words."""
    said = []
    for port, then in zip(ports, before, strict=True):
        now = port.received_here()
        if now is not None and then is not None and now > then:
            said.append(f"{now - then} values to {port!r}")
    return ", ".join(said)
