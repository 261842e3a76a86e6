"""A spec's fields checked one at a time (_spec.py's specs call these from ``__post_init__``): ids,
OTP's words, shutdown, restart flags, intensity and period, deadlines, shapes. Each error names
the spec, the field, the value given and the values allowed."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Protocol

from ._spec_errors import SpecError
from ._spec_words import Restart, Shutdown, ShutdownSpec, Strategy


class ChildFields(Protocol):
    """What every kind of child spec has (Supervisor, Worker, Mesh)."""

    @property
    def restart(self) -> Restart: ...
    @property
    def shutdown(self) -> ShutdownSpec: ...
    @property
    def significant(self) -> bool: ...


class GroupFields(Protocol):
    """What a group of children has (Supervisor, Mesh)."""

    @property
    def strategy(self) -> Strategy: ...
    @property
    def intensity(self) -> int: ...
    @property
    def period(self) -> float: ...


def set_field(obj: object, name: str, value: object) -> None:
    # Frozen dataclasses normalise their own fields in __post_init__ this way.
    object.__setattr__(obj, name, value)


def as_word(path: str, name: str, value: Any, kind: type[enum.StrEnum]) -> Any:
    """Accept a member or OTP's word for it ('one_for_one'), so specs can come from config."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise SpecError(path, name, value, allowed) from None


def check_id(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value:
        raise SpecError(
            f"{kind} {value!r}",
            "id",
            value,
            "a non-empty str without '/'",
            "ids form paths like 'rl/rollouts/2'",
        )
    return value


def check_shutdown(path: str, value: object) -> ShutdownSpec:
    if isinstance(value, str):
        return _shutdown_word(path, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(path, "shutdown", value, _SHUTDOWN_ALLOWED)
    if not (value > 0 and math.isfinite(value)):
        raise SpecError(path, "shutdown", value, _SHUTDOWN_ALLOWED, "BRUTAL_KILL kills at once")
    return float(value)


_SHUTDOWN_ALLOWED = "BRUTAL_KILL, INFINITY or a positive number of seconds"


def _shutdown_word(path: str, value: str) -> Shutdown:
    try:
        return Shutdown(value)
    except ValueError:
        raise SpecError(path, "shutdown", value, _SHUTDOWN_ALLOWED) from None


def check_child_flags(path: str, spec: ChildFields) -> None:
    """Fields every kind of child has: restart, shutdown, significant.

    OTP rule 3's first half (docs/otp-rules.md): the check that needs no parent.
    """
    set_field(spec, "restart", as_word(path, "restart", spec.restart, Restart))
    set_field(spec, "shutdown", check_shutdown(path, spec.shutdown))
    if not isinstance(spec.significant, bool):
        raise SpecError(path, "significant", spec.significant, "True or False")
    if spec.significant and spec.restart is Restart.PERMANENT:
        raise SpecError(
            path,
            "significant",
            True,
            "False for a PERMANENT child",
            "a permanent child is always restarted, so its exit can never shut the group down; "
            "use restart=TRANSIENT or TEMPORARY",
        )


def check_group_flags(path: str, spec: GroupFields) -> None:
    """strategy, intensity and period, shared by Supervisor and Mesh.

    OTP rule 1 (docs/otp-rules.md).
    """
    set_field(spec, "strategy", as_word(path, "strategy", spec.strategy, Strategy))
    intensity = spec.intensity
    if isinstance(intensity, bool) or not isinstance(intensity, int) or intensity < 0:
        raise SpecError(path, "intensity", intensity, "an int >= 0 (restarts allowed per period)")
    period = spec.period
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not (period > 0 and math.isfinite(period))
    ):
        raise SpecError(path, "period", period, "a positive number of seconds")
    set_field(spec, "period", float(period))


def check_deadline(path: str, value: object, field: str = "progress_deadline") -> float | None:
    """None, or a positive, finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(path, field, value, "None or a positive number of seconds")
    if not (value > 0 and math.isfinite(value)):
        raise SpecError(path, field, value, "None or a positive number of seconds")
    return float(value)


def check_shape(path: str, shape: object) -> dict[str, int]:
    allowed = "a non-empty dict of dimension name (identifier) to positive int, e.g. {'gpus': 4}"
    if not isinstance(shape, Mapping) or not shape:
        raise SpecError(path, "shape", shape, allowed)
    for name, size in shape.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecError(path, "shape", dict(shape), allowed, f"bad dimension name {name!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SpecError(path, "shape", dict(shape), allowed, f"bad size {name}={size!r}")
    return dict(shape)
