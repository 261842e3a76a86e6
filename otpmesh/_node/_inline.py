"""Async endpoints that cannot suspend: an ``async def`` whose body has no ``await``, ``async
for`` or ``async with`` (``async def echo(self, x): return x``) ends at its first step, so it
can run where a plain-def endpoint runs, without a task switch or a cancel scope.

Python decides whether a coroutine may suspend when it compiles it: only the opcodes below give
control back to the loop. A coroutine without them never reaches a trio checkpoint, so no
cancellation, no deadline and no other task can come between its start and its end; running it
to the end at once (``coro.send(None)``) is what trio would do, one scheduler pass sooner.
"""

from __future__ import annotations

import dis
import inspect
from types import CodeType

# Every opcode an awaiting coroutine uses (3.11 and later; the older names for safety).
_SUSPENDING = frozenset(
    op
    for name in (
        "YIELD_VALUE",
        "YIELD_FROM",
        "SEND",
        "GET_AWAITABLE",
        "GET_AITER",
        "GET_ANEXT",
        "BEFORE_ASYNC_WITH",
        "SETUP_ASYNC_WITH",
        "END_ASYNC_FOR",
        "ASYNC_GEN_WRAP",
    )
    if (op := dis.opmap.get(name)) is not None
)


def never_suspends(cls: type, name: str) -> bool:
    """Whether method `name` of `cls` is a plain ``async def`` that cannot suspend (its own
    code, not a wrapper that returns someone else's coroutine)."""
    fn = inspect.getattr_static(cls, name, None)
    code = getattr(fn, "__code__", None)
    if type(code) is not CodeType or not code.co_flags & inspect.CO_COROUTINE:
        return False
    return not any(ins.opcode in _SUSPENDING for ins in dis.get_instructions(code))
