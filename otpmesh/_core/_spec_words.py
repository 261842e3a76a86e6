"""The words of supervision specs: OTP's strategies, restart types, auto-shutdown and shutdown
values, as enums whose values are OTP's own words (so specs can come from config files)."""

from __future__ import annotations

import enum
from typing import TypeAlias


class Strategy(enum.StrEnum):
    """What a supervisor restarts when a child is to be restarted (OTP's ``strategy`` flag)."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    ALL_FOR_ONE = "one_for_all"  # the seed's name; an alias, so the two compare equal
    REST_FOR_ONE = "rest_for_one"
    ESCALATE = "escalate"  # otpmesh's addition: stop the group, exit with the child's reason


class Restart(enum.StrEnum):
    """When a child that exited is restarted (OTP's ``restart`` key)."""

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class AutoShutdown(enum.StrEnum):
    """When the exit of significant children shuts their supervisor down (OTP 24+)."""

    NEVER = "never"
    ANY_SIGNIFICANT = "any_significant"
    ALL_SIGNIFICANT = "all_significant"


class Shutdown(enum.StrEnum):
    """The non-numeric shutdown specs; a number of seconds is the third kind."""

    BRUTAL_KILL = "brutal_kill"
    INFINITY = "infinity"


ONE_FOR_ONE = Strategy.ONE_FOR_ONE
ONE_FOR_ALL = Strategy.ONE_FOR_ALL
ALL_FOR_ONE = Strategy.ALL_FOR_ONE
REST_FOR_ONE = Strategy.REST_FOR_ONE
ESCALATE = Strategy.ESCALATE
PERMANENT = Restart.PERMANENT
TRANSIENT = Restart.TRANSIENT
TEMPORARY = Restart.TEMPORARY
NEVER = AutoShutdown.NEVER
ANY_SIGNIFICANT = AutoShutdown.ANY_SIGNIFICANT
ALL_SIGNIFICANT = AutoShutdown.ALL_SIGNIFICANT
BRUTAL_KILL = Shutdown.BRUTAL_KILL
INFINITY = Shutdown.INFINITY

ShutdownSpec: TypeAlias = Shutdown | float
"""``BRUTAL_KILL``, ``INFINITY`` or a timeout in seconds (graceful stop, then kill)."""
