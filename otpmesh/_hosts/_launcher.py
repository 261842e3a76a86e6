"""What ``otpmesh.cluster`` needs of a launcher (the ones otpmesh ships are in the public
``otpmesh.launchers``, which re-exports this protocol): a Protocol here, in the layer that uses
it, so that the cluster need not import the public modules above it."""

from __future__ import annotations

from typing import Protocol


class Launcher(Protocol):
    """Starts agents that dial `controller`; ``hosts`` is how many registrations to wait for."""

    @property
    def hosts(self) -> int: ...
    async def start(self, controller: str, secret: bytes) -> None: ...
    async def stop(self) -> None: ...
    def failure(self) -> str | None:
        """Why an agent it started has already exited (before registering), if one has."""

    def ended(self) -> dict[int, str]:
        """The ranks whose launch has ended (the agent's process, ssh session or srun step),
        each with why: their hosts are lost, whatever their agents still say."""
