"""The restart-intensity check: a tiny pure function over restart times (OTP's ``add_restart``).

OTP 25 (``supervisor:add_restart/3``) keeps restart stamps newest first, taken with
``erlang:monotonic_time(second)``; on each restart it drops the stamps ``< now - period``,
prepends ``now``, and gives up when more than ``intensity`` stamps remain. So a stamp taken at
``t`` still counts at ``now`` iff ``now - t <= period`` (inclusive), and ``intensity`` restarts
within ``period`` are tolerated while the next one is fatal.

otpmesh keeps that rule, boundary included, but with the driver's clock in float seconds instead of
truncating to whole seconds. OTP's truncation is an artefact of its clock, not a semantic: it makes
the effective window anywhere between ``period`` and ``period + 1`` seconds depending on where in
a second the restarts fall, and it cannot express sub-second periods, which otpmesh allows. Where
restart times are whole seconds (MockClock tests, or faults at the same instant) the two agree
exactly; that is what the Erlang differential tests check.
"""

from __future__ import annotations

Restarts = tuple[float, ...]
"""Restart times in seconds, newest first."""


def add_restart(restarts: Restarts, now: float, period: float) -> Restarts:
    """Register a restart at `now`, forgetting those older than `period` seconds."""
    threshold = now - period
    return (now, *(t for t in restarts if t >= threshold))


def intensity_exceeded(restarts: Restarts, intensity: int) -> bool:
    """True when the restarts in the window are more than the supervisor tolerates."""
    return len(restarts) > intensity
