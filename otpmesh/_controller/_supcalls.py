"""OTP's calls on a running tree's supervisors: ``start_child``, ``terminate_child``,
``restart_child``, ``delete_child``, ``which_children``, and ``exit(Sup, Reason)`` or
``exit(Sup, kill)``; each request posted to the supervisor's driver and its reply awaited.
``SupervisorCalls`` is that part of ``TreeContext`` (_tree.py; its state is the tree's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from .._core._children import ChildInfo
from .._core._errors import ChildError
from .._core._spec import Mesh, Supervisor, Worker
from .._core._supevents import (
    DeleteChildRequest,
    Outcome,
    Reply,
    RestartChildRequest,
    StartChildRequest,
    Stop,
    TerminateChildRequest,
)
from ._driver import SupervisorDriver

_OK = (Outcome.OK, Outcome.IGNORED)


class SupervisorCalls:
    """The supervisors of a tree (and of the trees its actors own), found by path and asked."""

    specs: dict[str, Supervisor | Worker | Mesh]
    subtrees: Sequence[SupervisorCalls]
    root: SupervisorDriver
    _replies: dict[int, tuple[trio.Event, list[Reply]]]
    _refs: Iterator[int]
    #: A child added by start_child learned (its paths, its exits heard): the tree's.
    _learn: Callable[[Supervisor | Worker | Mesh, str], None]
    work_started: Callable[[], None]
    work_done: Callable[[], None]

    async def start_child(self, sup_path: str, spec: Worker | Supervisor | Mesh) -> Outcome:
        driver = self._driver(sup_path)
        if spec.id and f"{sup_path}/{spec.id}" not in self.specs:
            self._learn(spec, sup_path)
        return await self._request(
            driver, lambda ref: StartChildRequest(ref, spec), f"{sup_path}/{spec.id}"
        )

    async def terminate_child(self, path: str) -> Outcome:
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: TerminateChildRequest(ref, child), path)

    async def restart_child(self, path: str) -> Outcome:
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: RestartChildRequest(ref, child), path)

    async def delete_child(self, path: str) -> Outcome:
        sup, child = self._split(path)
        return await self._request(sup, lambda ref: DeleteChildRequest(ref, child), path)

    def _split(self, path: str) -> tuple[SupervisorDriver, str]:
        sup_path, _, child = path.rpartition("/")
        return self._driver(sup_path), child

    def _driver(self, sup_path: str) -> SupervisorDriver:
        driver = self._find_driver(sup_path)
        if driver is None:
            raise KeyError(f"no running supervisor at {sup_path!r}")
        return driver

    def which_children(self, sup_path: str) -> list[ChildInfo]:
        driver = self._driver(sup_path)
        return [] if driver.core.done else driver.core.which_children()

    def exit_supervisor(self, sup_path: str, reason: object) -> bool:
        """OTP's ``exit(Sup, Reason)``: the running supervisor at `sup_path` terminates its
        children in its order and exits with `reason`; its parent applies its strategy. False
        if no supervisor runs there."""
        driver = self._find_driver(sup_path)
        if driver is None:
            return False
        driver.post(Stop(reason))
        return True

    async def kill_supervisor(self, sup_path: str) -> bool:
        """OTP's ``exit(Sup, kill)``: everything under the running supervisor at `sup_path` is
        killed at once (brutal: no orderly stop, no ``on_stop``), and once it is gone the
        supervisor exits with ``killed``; its parent applies its strategy. False if no
        supervisor runs there."""
        driver = self._find_driver(sup_path)
        if driver is None:
            return False
        self.work_started()  # settled() waits for the kill and what the parent does about it
        try:
            await driver.kill()
        finally:
            self.work_done()
        return True

    def _find_driver(self, sup_path: str) -> SupervisorDriver | None:
        stack = [self.root]
        while stack:
            driver = stack.pop()
            if driver.path == sup_path and not driver.exited.is_set():
                return driver
            stack.extend(driver.children.values())
        for sub in self.subtrees:  # the trees its actors own
            found = sub._find_driver(sup_path)
            if found is not None:
                return found
        return None

    async def _request(self, driver: SupervisorDriver, make: Any, path: str) -> Outcome:
        ref = next(self._refs)
        done: tuple[trio.Event, list[Reply]] = (trio.Event(), [])
        self._replies[ref] = done
        driver.post(make(ref))
        await done[0].wait()
        reply = done[1][0]
        if reply.outcome in _OK:
            return reply.outcome
        raise ChildError(path, reply.outcome, reply.reason)

    def reply(self, reply: Reply) -> None:
        waiting = self._replies.pop(reply.ref, None)  # type: ignore[call-overload]
        if waiting is not None:
            waiting[1].append(reply)
            waiting[0].set()
