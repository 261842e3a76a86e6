"""Errors of the pure supervision layer (specs and the sans-IO core).

Kept apart from ``_errors.py`` until the two are folded together; nothing here imports the runtime.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Raised by Supervisor, Worker and Mesh when a field of a supervision spec is invalid."""

    def __init__(self, path: str, field: str, value: object, allowed: str, why: str = "") -> None:
        self.path = path
        self.field = field
        self.value = value
        self.allowed = allowed
        because = f" ({why})" if why else ""
        super().__init__(f"{path}: {field}={value!r} is invalid{because}; allowed: {allowed}")


class SupervisorProtocolError(RuntimeError):
    """Raised by SupervisorCore when a driver feeds an event the core did not ask for."""
