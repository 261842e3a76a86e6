"""Every exception otpmesh raises, in one place.

Remote errors cross the wire as data (type name, message, traceback text), never pickled.
"""

from __future__ import annotations


class OtpmeshError(Exception):
    """Base class of every error otpmesh raises on purpose."""


class ActorError(OtpmeshError):
    """Raised by a call when the remote endpoint raised; carries its type, message and traceback."""

    def __init__(self, actor: str, type_name: str, message: str, traceback: str = "") -> None:
        self.actor = actor
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        super().__init__(f"{actor} raised {type_name}: {message}")

    def __str__(self) -> str:
        head = f"{self.actor} raised {self.type_name}: {self.message}"
        if self.traceback:
            return f"{head}\n--- remote traceback ---\n{self.traceback.rstrip()}"
        return head


class ActorDiedError(OtpmeshError):
    """Raised by a call to an actor that is dead or died before it replied; says why it died."""

    def __init__(self, actor: str, reason: str, *, delivered: bool = True) -> None:
        self.actor = actor
        self.reason = reason
        #: False when the call never reached the actor (safe to send again after a restart).
        self.delivered = delivered
        super().__init__(f"{actor} is dead: {reason}")


class DeadlockError(OtpmeshError):
    """Raised by a call from inside an actor that could never be answered: to the actor itself,
    or back to an actor that is busy waiting on the call that led here (OTP's calling_self)."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        path = " -> ".join(cycle)
        super().__init__(
            f"call cycle {path}: {cycle[-1]} is busy waiting on this very call, so the call "
            "would wait forever; use a cast (.broadcast) or answer without calling back"
        )


class CallTimeoutError(OtpmeshError, TimeoutError):
    """Raised by a call when no reply came within its timeout; names the actors that were late."""

    def __init__(self, actors: list[str], endpoint: str, timeout: float) -> None:
        self.actors = actors
        self.endpoint = endpoint
        self.timeout = timeout
        shown = ", ".join(actors[:8]) + (f" and {len(actors) - 8} more" if len(actors) > 8 else "")
        if not actors:  # not a call of actors (a spawn, a stop): `endpoint` says what it was
            super().__init__(f"{endpoint} timed out after {timeout:g} s")
            return
        super().__init__(f"call to {endpoint!r} on {shown} timed out after {timeout:g} s")


class ProtocolError(OtpmeshError):
    """Raised by the frame decoder when bytes on a connection break the wire protocol."""


class EncodeError(OtpmeshError, TypeError):
    """Raised when a message holds a value the wire cannot carry (otpmesh never pickles)."""


class SpawnError(OtpmeshError):
    """Raised by proc_mesh or spawn when a worker process or an actor could not be started."""

    def __init__(self, *args: object, failed: dict[int, BaseException] | None = None) -> None:
        super().__init__(*args)
        #: Each rank that failed to start, with its error (empty when no rank was tried).
        self.failed: dict[int, BaseException] = dict(failed or {})


class MeshError(OtpmeshError, ValueError):
    """Raised on misuse of a mesh: bad shape, bad slice, call_one on many actors."""


class SingletonError(OtpmeshError, TypeError):
    """Raised by otpmesh.singleton when its name is bound to another actor class than the one
    asked for: a singleton's class is its first request's, for as long as the controller runs."""


class SupervisorError(OtpmeshError):
    """Raised by otpmesh.start when the root supervisor fails to start or gives up."""

    def __init__(self, message: str, reason: object = None) -> None:
        self.reason = reason
        super().__init__(message)


class AppStoppedError(OtpmeshError):
    """Raised by a background app's calls (otpmesh.start_background) once the app has stopped,
    and by those under way when it stopped."""


class ChildError(OtpmeshError):
    """Raised by the app's dynamic-children calls with OTP's outcome (not_found, running, ...)."""

    def __init__(self, path: str, outcome: object, reason: object = None) -> None:
        self.path = path
        self.outcome = outcome
        self.reason = reason
        detail = f": {reason}" if reason is not None else ""
        super().__init__(f"{path}: {outcome}{detail}")


class UsageError(OtpmeshError):
    """Raised by the otpmesh command line when its input is unusable; it exits with status 2."""


class GroupError(OtpmeshError):
    """Raised by a process-group member's join when the group cannot be formed or joined."""


class StaleEpochError(GroupError):
    """Raised by a process-group member's join when its ticket is for another epoch than the
    rendezvous store's: a member of an old epoch can never join or talk to a newer one."""

    def __init__(self, group: str, epoch: int, found: str) -> None:
        self.group = group
        self.epoch = epoch
        self.found = found
        super().__init__(
            f"{group}: a member of epoch {epoch} cannot join the group's store, which is at "
            f"epoch {found}; an old epoch's members are fenced off (restart them with the group)"
        )


class PortClosedError(OtpmeshError):
    """Raised by PortReceiver.recv when its stream has ended: a sender closed the port, or the
    receiver itself was closed; ``async for`` over the receiver ends instead."""


class PortOverflowError(OtpmeshError):
    """Raised by PortReceiver.recv, after the values it holds, when more values arrived than
    its capacity while nobody read them: the stream failed there and later values were dropped."""


class TakeoverError(OtpmeshError):
    """Raised by otpmesh.start(takeover=...) when its state directory is unsafe or unusable, or
    another controller holds the app's lease and this one was not started as a standby."""


class FencedError(TakeoverError):
    """Raised by a worker's or fork server's adoption when the controller asking presents an
    epoch no higher than the one served: an older controller, fenced off by a takeover."""


class StandbyDoneError(TakeoverError):
    """Raised by otpmesh.start(takeover=Takeover(..., standby=True)) when the lease it waited
    for came free because the run it stood by for stopped in order: there is nothing to take
    over. ``otpmesh.run`` ends with status 0 on it."""
