"""Monarch's ``Channel``, ``Port`` and ``PortReceiver`` over otpmesh's: the port is otpmesh's
own (a value that travels; ``send`` never blocks); the receiver's ``recv()`` returns a Future,
read with ``.get()`` or ``await``, as in Monarch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .._node._aioloop import bridge
from .._node._ports import DEFAULT_CAPACITY
from .._node._ports import Channel as NativeChannel
from .._node._ports import Port as NativePort
from .._node._ports import PortReceiver as NativeReceiver
from .._runtime import _run
from .._runtime._controller_runtime import runtime
from ._future import Future
from ._meshes import Port as Port
from ._meshes import to_monarch
from ._where import in_trio, start

T = TypeVar("T")
Ready = Callable[[], None]


class PortReceiver(Generic[T]):
    """The receiving end of a Channel, in the process that opened it."""

    __slots__ = ("_native",)

    def __init__(self, native: NativeReceiver[T]) -> None:
        self._native = native

    def recv(self) -> Future[T]:
        """The next value sent on the port (in each sender's order)."""

        async def recv(ready: Ready) -> T:
            ready()
            value: T = to_monarch(await self._native.recv())
            return value

        return start(recv)

    def close(self) -> None:
        """Stop receiving: later sends are dropped."""

        async def close(ready: Ready) -> None:
            ready()
            self._native.close()

        start(close)


class Channel(Generic[T]):
    """``port, receiver = Channel[int].open()``: a port to hand out, and its receiver here."""

    __slots__ = ()

    @staticmethod
    def open(capacity: int = DEFAULT_CAPACITY) -> tuple[Port[T], PortReceiver[T]]:
        if in_trio() or bridge() is not None:
            port, receiver = NativeChannel[T].open(capacity)
        else:  # a plain thread: the channel lives in the client runtime's node

            async def opened(ready: Ready) -> tuple[NativePort[T], NativeReceiver[T]]:
                ready()
                if not _run.IN_WORKER:
                    await runtime()  # the controller's node, started if need be
                return NativeChannel[T].open(capacity)

            port, receiver = start(opened).get()
        return port.retyped(Port), PortReceiver(receiver)
