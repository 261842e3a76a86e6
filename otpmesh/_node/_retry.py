"""Retrying idempotent calls across restarts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from .._core._errors import ActorDiedError, CallTimeoutError

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
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            return await call(*args, **kwargs)
        except retry_on:
            if attempt == attempts:
                raise
        await trio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover
