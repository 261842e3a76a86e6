"""What an endpoint's outcome does to its actor and its caller: the error policy.

Said by the endpoint or its class: an ``Exception`` escaping an endpoint crashes the actor
(``let_it_crash=True``: OTP's let it crash, and its linked calls); under ``let_it_crash=False``
it goes back to the caller while the actor keeps its state, and a broadcast's (no caller) is
logged; under ``let_it_crash=UNANSWERED`` (Monarch's rule) it goes back to a caller and a
broadcast's crashes the actor.

Said by nobody (the default), let it crash where a restart gives a clean state, and only there:
- a failure of a *callee* that escapes the endpoint (``ActorDiedError``, ``CallTimeoutError``,
  ``DeadlockError``, or the ``ActorError`` of an actor it called) is news for the endpoint's
  caller, not a fault of this actor: it goes back to the caller (a broadcast's is logged) and
  the actor lives on. OTP's ``gen_server:call`` would exit the caller (a link); this is its
  ``catch`` form. ``let_it_crash=True`` asks for the linked form;
- an actor nothing will restart (``ProcMesh.spawn``: unsupervised) is not killed by an
  exception its caller hears of: ``UNANSWERED``;
- a supervised actor's own exception crashes it.

A BaseException the actor's code raised ends the actor whatever the policy (_raised.py).
Arguments that do not bind are the caller's error and never reach the endpoint.
docs/guides/endpoints.md ("What an endpoint's exception does").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._core._actor import UNANSWERED, ActorContext, EndpointInfo, Policy
from .._core._errors import ActorDiedError, ActorError, CallTimeoutError, DeadlockError
from .._core._exits import ActorCrash, describe, ended_by
from .._core._signature import bind_error
from . import _raised
from ._aioloop import ASYNCIO_HINT, needs_asyncio

if TYPE_CHECKING:
    from ._calls import Replier, ReplyTo

log = logging.getLogger("otpmesh.actor")


class Cell(Protocol):
    """What the policy needs of an actor's cell (_cell.py's ActorCell)."""

    ctx: ActorContext
    node: Replier
    passing: tuple[type[BaseException], ...]
    aio: Any
    exit_reason: object
    #: Whether a supervisor restarts it (False: spawned on a proc mesh without one).
    supervised: bool

    def set_exit(self, reason: object) -> None: ...
    def describe_exit(self) -> str: ...
    def forget_port(self, reply: ReplyTo) -> None: ...


def interrupted(cell: Cell, exc: BaseException, reply: ReplyTo | None) -> None:
    """A call was interrupted from outside (`exc`: a Cancelled, or a group of them from a
    nursery in the endpoint: the actor was killed, crashed or stopped): its caller still gets
    an answer, which says the call was delivered (it may have had effects: never sent again)."""
    if reply is not None and _raised.split(exc, (trio.Cancelled,))[0] is not None:
        cell.node.reply_error(reply, "ActorDiedError", cell.describe_exit(), "", kind="lost")


def bad_call(
    cell: Cell,
    info: EndpointInfo,
    args: list[Any],
    kwargs: dict[str, Any],
    reply: ReplyTo | None,
) -> bool:
    """True (and answered as the caller's error, the actor untouched) if the arguments do
    not bind to the endpoint: its caller had no signature to check them against."""
    params = info.params
    if params is None or (problem := params.problem(len(args), kwargs)) is None:
        return False
    text = bind_error(cell.ctx.path, info.name, params, problem)
    if reply is None:
        log.warning("%s: a cast was dropped: %s", cell.ctx.path, text)
    cell.node.reply_error(reply, "TypeError", text, "", kind="badcall")
    return True


def ended(cell: Cell, method: str, exc: BaseException, reply: ReplyTo | None) -> bool:
    """A BaseException escaped the endpoint: what belongs to the runtime goes on; what the
    actor's code raised ends this actor, and only it (_raised.py). Returns False."""
    passing, raised = _raised.split(exc, cell.passing)
    if raised is not None:
        reason = ended_by(raised, skip_frames=1, endpoint=method)
        if isinstance(reason, ActorCrash):
            log.error("%s crashed in %s:\n%s", cell.ctx.path, method, reason.traceback)
        else:
            log.info("%s stopped in %s (%s)", cell.ctx.path, method, describe(reason))
        if cell.exit_reason is None:
            cell.set_exit(reason)
        if passing is None and isinstance(reason, ActorCrash):
            cell.node.reply_error(reply, reason.type_name, reason.message, reason.traceback)
        elif passing is None:
            cell.node.reply_error(reply, "ActorDiedError", describe(reason), "", kind="lost")
    if passing is not None:
        raise passing  # the caller hears of it from _handle_one
    return False


def failed(
    cell: Cell, info: EndpointInfo, method: str, exc: Exception, reply: ReplyTo | None
) -> bool:
    """Report an endpoint's exception; return False when it crashes the actor."""
    if cell.aio is None and needs_asyncio(exc):
        exc.add_note(ASYNCIO_HINT)
    # The user's frames only (an asyncio actor's pass through run_async and the loop's).
    skip = 1 if cell.aio is None or not info.is_async else 3
    crash = ActorCrash.of(exc, skip_frames=skip, endpoint=method)
    # Log and announce the exit before replying: the caller must not see the error before
    # the supervisor can know of the crash.
    if info.reply_port and reply is not None:
        cell.forget_port(reply)  # answered with the error below
    policy = default_policy(cell, exc) if info.let_it_crash is None else info.let_it_crash
    crashes = policy is not False and (policy != UNANSWERED or reply is None)
    if crashes:
        log.error("%s crashed in %s:\n%s", cell.ctx.path, method, crash.traceback)
        if cell.exit_reason is None:
            cell.set_exit(crash)
    elif reply is None:
        log.error("%s: %s raised (actor lives on):\n%s", cell.ctx.path, method, crash.traceback)
    cell.node.reply_error(reply, crash.type_name, crash.message, crash.traceback)
    return not crashes


#: What a call raises when its callee failed (not the caller's own fault).
CALLEE_FAILURES = (ActorDiedError, CallTimeoutError, DeadlockError, ActorError)


def default_policy(cell: Cell, exc: Exception) -> Policy:
    """The policy of an endpoint that said none, for `exc` (module docstring)."""
    if isinstance(exc, CALLEE_FAILURES):
        return False
    return True if cell.supervised else UNANSWERED
