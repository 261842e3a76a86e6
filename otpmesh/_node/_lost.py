"""Re-sending the share of a call that was lost with its actor (``Endpoint.with_retry``).

A call to a supervised actor that never reached it (the actor was restarting) is always sent
again to the next incarnation: it cannot have had an effect. A call that reached the actor and
was lost when the actor died (``ActorDiedError`` with ``delivered``) may have had an effect, so
by default it reports the death. When the caller says the endpoint is safe to run again
(idempotent, or its effect dies with the actor), ``LostRetry`` lets the gather send that
member's call again to the next incarnation, a bounded number of times per member, while the
other members' results are kept: nothing that answered runs twice.

The policy is pure: given a member's failure, its slot and how often it was re-sent, say
whether to send it again. The gather (``_mesh.Endpoint._gather``) does the waiting and sending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core._errors import ActorDiedError
from ._slot import Slot


@dataclass(frozen=True, slots=True)
class LostRetry:
    """How many times each member's lost call may be sent again (0: never, today's default)."""

    lost: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.lost, bool) or not isinstance(self.lost, int) or self.lost < 0:
            raise ValueError(
                f"with_retry(lost=...) takes how many times one member's lost call may be sent "
                f"again, a whole number >= 0, not {self.lost!r}: e.g. ep.with_retry(lost=1)"
            )

    def budget(self, members: int) -> LostBudget:
        """The re-sends left to each of `members` members in one call."""
        return LostBudget([self.lost] * members)


NO_RETRY = LostRetry()  # a lost call reports its actor's death (the default)


class LostBudget:
    """One call's re-sends left, per member (by index in the call's slots)."""

    __slots__ = ("_left",)

    def __init__(self, left: list[int]) -> None:
        self._left = left

    def take(self, index: int, slot: Slot, error: Any) -> bool:
        """Should member `index`'s call, which failed with `error`, be sent again to the next
        incarnation of `slot`? Only a delivered call lost with a supervised actor that will
        come back, and only while the member has re-sends left (this one is then spent)."""
        if not (
            isinstance(error, ActorDiedError)
            and error.delivered
            and slot.supervised
            and slot.gone is None
            and self._left[index] > 0
        ):
            return False
        self._left[index] -= 1
        return True
