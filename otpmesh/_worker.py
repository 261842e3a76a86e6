"""The worker process: a node that hosts actors, started by the fork server for one mesh slot."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
from typing import Any

import trio

from ._actor import Actor, ActorContext, set_context
from ._cell import ActorCell, ExitReason
from ._errors import SpawnError
from ._node import HELLO, Node, set_current_node
from ._wire import Connection, dial

log = logging.getLogger("otpmesh.worker")

_MAIN_ALIAS = "__otpmesh_main__"


def import_class(path: str, main_path: str | None) -> type[Actor]:
    """Import an actor class by 'module:QualName' (the controller's __main__ by file path)."""
    module_name, _, qualname = path.partition(":")
    if module_name == "__main__":
        module = sys.modules.get(_MAIN_ALIAS)
        if module is None:
            if not main_path:
                raise SpawnError(f"{path}: the controller's __main__ has no file to import from")
            spec = importlib.util.spec_from_file_location(_MAIN_ALIAS, main_path)
            if spec is None or spec.loader is None:
                raise SpawnError(f"cannot import the controller's main file {main_path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[_MAIN_ALIAS] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Actor)):
        raise SpawnError(f"{path} is not an otpmesh.Actor subclass")
    return obj


class Worker:
    """The state of one worker process: its node and the controller connection."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.node = Node(
            "w",
            sys_handlers={
                "spawn_actor": self._spawn_actor,
                "stop_actor": self._stop_actor,
                "shutdown": self._shutdown,
            },
        )
        self.controller: Connection | None = None
        self._done = trio.Event()

    async def main(self) -> None:
        set_current_node(self.node)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.serve)
            sock = await dial(self.cfg["controller"])
            conn = Connection(
                sock,
                peer=self.cfg["controller"],
                decode=self._decode,
                on_message=self.node._on_message,
            )
            self.controller = conn
            self.node.register(self.cfg["controller"], conn)
            conn.send_nowait(self._hello())
            nursery.start_soon(self._serve_controller, conn)
            await self._done.wait()
            nursery.cancel_scope.cancel()

    @staticmethod
    def _decode(frame: bytes) -> Any:
        from ._node import decode_message

        return decode_message(frame)

    def _hello(self) -> bytes:
        from . import _codec

        return _codec.pack(
            [HELLO, {"proc": self.cfg["proc"], "pid": os.getpid(), "addr": self.node.addr}]
        )

    async def _serve_controller(self, conn: Connection) -> None:
        # The controller's connection is this process's lifeline: when it goes, so do we.
        try:
            await self.node._run_connection(conn)
        finally:
            self._done.set()

    async def _spawn_actor(self, conn: Connection | None, p: dict[str, Any]) -> None:
        cls = import_class(p["cls"], p.get("main"))
        ctx = ActorContext(
            name=p["name"],
            path=p["id"],
            rank=p["rank"],
            coords=p["coords"],
            shape=p["shape"],
            pid=os.getpid(),
        )
        token = set_context(ctx)
        try:
            instance = cls(*p["args"], **p["kwargs"])
        finally:
            from ._actor import _current

            _current.reset(token)
        cell = ActorCell(self.node, ctx, instance, cls.endpoints(), self._actor_exited)
        self.node.actors[ctx.path] = cell
        self.node.exited.pop(ctx.path, None)
        assert self.node.nursery is not None
        self.node.nursery.start_soon(cell.run)

    async def _stop_actor(self, conn: Connection | None, p: dict[str, Any]) -> None:
        cell = self.node.actors.get(p["id"])
        if cell is not None:
            cell.stop(ExitReason(p.get("reason", "shutdown")))

    async def _shutdown(self, conn: Connection | None, p: Any) -> None:
        for cell in list(self.node.actors.values()):
            cell.stop(ExitReason("shutdown"))
        self._done.set()

    def _actor_exited(self, cell: ActorCell) -> None:
        reason = cell.exit_reason or ExitReason("shutdown")
        if self.node.actors.get(cell.ctx.path) is cell:
            del self.node.actors[cell.ctx.path]
        self.node.exited[cell.ctx.path] = reason.describe()
        if self.controller is not None:
            self.node.sys_cast(
                self.controller, "actor_exited", {"id": cell.ctx.path, "reason": reason.to_data()}
            )


def main(cfg: dict[str, Any]) -> int:
    """Run a worker until its controller goes away. Called in the forked child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from . import _run

    _run.IN_WORKER = True
    sys.path[:] = cfg["sys_path"]
    os.chdir(cfg["cwd"])
    logging.basicConfig(
        level=cfg.get("log_level", logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
    trio.run(Worker(cfg).main)
    return 0
