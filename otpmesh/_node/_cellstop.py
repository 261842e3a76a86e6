"""How an actor's cell stops: after the current message (``request_stop``), at once with a
crash (``crash``), or killed (``kill``), its exit announced before any reply; what is left in
its mailboxes answered with its exit. ``CellStopping`` is that part of ``ActorCell`` (_cell.py;
its state is the cell's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._core._exits import describe
from .._core._reasons import KILLED
from ._calls import Message
from ._flight import Flight, drain

if TYPE_CHECKING:
    from ._calls import Replier


class CellStopping:
    """An actor's exit: its reason, set once, and the scopes and mailbox that end with it."""

    node: Replier
    exit_reason: object
    exited: bool
    send: trio.MemorySendChannel[Message]
    in_flight: Flight
    _receive: trio.MemoryReceiveChannel[Message]
    _on_exiting: Callable[[Any], None] | None
    _kill_scope: trio.CancelScope
    _serve_scope: trio.CancelScope
    _idle: bool  # its task waits for its next message

    def describe_exit(self) -> str:
        return "running" if self.exit_reason is None else describe(self.exit_reason)

    def request_stop(self, reason: object) -> None:
        """Stop after the current message (run ``on_stop``); queued messages are not handled."""
        if self.exit_reason is None:
            self.set_exit(reason)
            self._wake_idle()

    def crash(self, reason: object) -> None:
        """Exit now with `reason`, interrupting the current message; ``on_stop`` still runs."""
        if self.exit_reason is None:
            self.set_exit(reason)
        self._serve_scope.cancel()

    def kill(self) -> None:
        """Stop at once: cancel whatever the actor is doing, skip ``on_stop``."""
        if self.exit_reason is None:
            self.set_exit(KILLED)
        elif not self.exited:
            self.exit_reason = KILLED
        self._kill_scope.cancel()

    def set_exit(self, reason: object) -> None:
        # Announced at once (before any reply to the message that caused it), so the supervisor
        # knows an exit is coming while on_stop still runs.
        self.exit_reason = reason
        if self._on_exiting is not None:
            self._on_exiting(self)

    def end_calls(self) -> None:
        """End the message being served and every call in flight (the actor has crashed)."""
        self._serve_scope.cancel()

    def _wake_idle(self) -> None:
        """The actor is done: if its task waits for a message, end the wait by closing the
        mailbox (calls sent from now on are answered dead, as they would be by its exit)."""
        if self._idle:
            self.send.close()

    def _drain(self) -> None:
        reason = self.describe_exit()
        drain(self.send, self._receive, self.node, reason)
        self.in_flight.drain(reason)
