"""An agent's side of its lifeline (_lifeline.py has the controller's): once registered, it
dials the controller again, presents the one-time token its registration handed it, and beats
both ways on that connection too, in the agent's own trio loop (no user code holds it).

Losing the lifeline alone is not losing the controller: the two connections are not ordered with
each other, and a controller that stops in order closes its lifelines while its ``shutdown`` is
still on its way on the main one (an agent that took the lifeline's end for the controller's
death went on looking for one instead of exiting). A dead controller closes both; a partitioned
one is silent on both (AGENT_TIMEOUT); a controller that finds a lifeline broken declares the
host dead and closes the main connection itself. Without its lifeline the agent goes on, judged
by the beats of its main connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from .._core._errors import ProtocolError
from .._wire import _codec
from .._wire._connection import Connection
from .._wire._frames import HELLO
from .._wire._handshake import dial
from ._lifeline import BEAT, is_beat

log = logging.getLogger("otpmesh.agent")

DIAL_TIMEOUT = 5.0


class AgentLifeline:
    """One agent's lifeline: ``on_token`` is its ``lifeline`` handler, ``run`` a task of each
    registration (its session) that opens the lifeline once the token came."""

    def __init__(self, on_beat: Callable[[Any], None], interval: float) -> None:
        self._on_beat = on_beat
        self._interval = interval
        self._tokens: trio.MemorySendChannel[bytes] | None = None

    def on_token(self, payload: Any) -> None:
        token = payload.get("token") if isinstance(payload, dict) else None
        if type(token) is bytes and self._tokens is not None:
            try:
                self._tokens.send_nowait(token)
            except trio.WouldBlock:  # one lifeline per registration
                pass

    async def run(self, conn: Connection, controller: str, secret: bytes, host_id: str) -> None:
        """Open the lifeline of the registration on `conn` and run it until it closes (`conn`
        is left to its own end: see the module docstring)."""
        self._tokens, tokens = trio.open_memory_channel[bytes](1)
        token = await tokens.receive()
        hello = {"lifeline": host_id, "token": token}
        try:
            why = await _run(controller, secret, hello, self._on_beat, self._interval)
        except (OSError, ProtocolError, trio.TooSlowError) as exc:
            why = f"could not open it: {exc or type(exc).__name__}"
        if not conn.closed:
            log.info("agent lifeline to %s closed: %s", controller, why)


async def _run(
    controller: str, secret: bytes, hello: dict[str, Any], on_beat: Any, interval: float
) -> str:
    """Dial `controller` and run an agent's lifeline (in its trio loop: nothing holds it) until
    it closes; return why. Beats are sent only once the controller's first arrived: until then
    its thread does not own the socket, and a byte sent early would be refused."""
    with trio.fail_after(DIAL_TIMEOUT):
        sock, mac = await dial(controller, secret)
    answered = trio.Event()

    def on_message(conn: Connection, message: Any, pending: Any) -> None:
        if not is_beat(message):
            raise ProtocolError("a lifeline carries beats only")
        answered.set()
        on_beat(None)

    conn = Connection(
        sock,
        peer=f"lifeline to {controller}",
        decode=lambda frame: (_codec.unpack(frame), ()),
        on_message=on_message,
        mac=mac,
    )
    conn.send_nowait(_codec.pack([HELLO, hello]))

    async def beat() -> None:
        await answered.wait()
        while not conn.closed:
            conn.send_nowait(BEAT)
            await trio.sleep(interval)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        await conn.run()
        nursery.cancel_scope.cancel()
    return conn.close_reason or "closed"
