"""An RL service actor that owns and supervises its replicas.

The controller's tree holds one actor, ``rl/service``. In ``on_start`` it starts a subtree it
owns: a ONE_FOR_ONE mesh of 3 replica actors (``rl/service/replicas/0..2``), each in a worker
process the controller forks for it. The service routes ``generate`` calls to its replicas;
the controller calls the service, and calls the replicas too, through refs the service returns.

1. A replica is SIGKILLed: its supervisor (inside the subtree) restarts it; the service and the
   other replicas keep serving.
2. Replicas crash past the subtree's restart intensity: the subtree gives up, so its owner, the
   service, crashes with the subtree's SupervisorError as its reason, and the service's own
   supervisor (``rl``) restarts it with a fresh subtree. The event log shows the escalation path.

    python examples/rl_service.py
"""

from __future__ import annotations

import os
import signal

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, Worker


class Replica(otpmesh.Actor):
    """Stands in for an inference engine: answers prompts, counts what it served."""

    def __init__(self) -> None:
        self.served = 0

    @otpmesh.endpoint
    async def generate(self, prompt: str) -> str:
        self.served += 1
        return f"{prompt}->{otpmesh.context().rank}"

    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    async def fail(self) -> None:
        raise RuntimeError("engine fault")


class RolloutService(otpmesh.Actor):
    """Owns its replicas: started with it, stopped with it, escalating to it."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.next = 0

    async def on_start(self) -> None:
        spec = Mesh(
            "replicas",
            Replica,
            shape={"procs": self.replicas},
            strategy=ONE_FOR_ONE,
            intensity=2,  # a third crash within the period gives up, and this actor crashes
            period=30.0,
        )
        self.pool = await otpmesh.context().start(spec)

    @otpmesh.endpoint
    async def generate(self, prompt: str) -> str:
        mesh = self.pool.mesh()
        for _ in range(len(mesh)):  # a replica that is restarting: ask the next one
            rank, self.next = self.next, (self.next + 1) % len(mesh)
            try:
                return str(await mesh[rank].generate(prompt))
            except otpmesh.ActorDiedError:
                continue
        raise RuntimeError("no replica answered")

    @otpmesh.endpoint
    async def replicas_mesh(self) -> otpmesh.ActorMesh:
        return self.pool.mesh()


async def exited(app: otpmesh.App, path: str) -> None:
    while not any(e.kind == LogKind.CHILD_EXITED and e.child_path == path for e in app.events):
        await trio.sleep(0.01)


tree = Supervisor("rl", intensity=3, children=[Worker("service", RolloutService, args=(3,))])


async def main() -> None:
    async with otpmesh.start(tree) as app:
        service = app.actor("rl/service")
        print("answers:", [await service.generate(f"p{i}") for i in range(6)])

        replicas = await service.replicas_mesh()  # refs the service made work here too
        victim = await replicas[1].pid()
        os.kill(victim, signal.SIGKILL)
        print(f"SIGKILLed rl/service/replicas/1 (pid {victim})")
        await exited(app, "rl/service/replicas/1")  # noticed (a socket's end, then the status)
        await app.settled()  # and restarted
        print("answers:", [await service.generate(f"q{i}") for i in range(3)])
        print("replica 1 is back in pid", await replicas[1].pid())

        for _ in range(2):  # two more crashes: three within the period, past intensity 2
            try:
                await replicas[0].fail()
            except otpmesh.ActorError as error:
                print(f"rl/service/replicas/0 raised: {error.type_name}: {error.message}")
            await app.settled()
        await app.settled()
        found = await otpmesh.lookup("rl/service/replicas")  # by path, from any process
        print("looked up:", found, "->", (await found.generate("r")).values())

        print("\nescalation (exits, then the service's restart):")
        for e in app.events:
            if e.kind in (LogKind.CHILD_EXITED, LogKind.SUPERVISOR_EXITED) or (
                e.kind == LogKind.CHILD_STARTED and e.child_path == "rl/service"
            ):
                reason = "" if e.reason is None else f"  ({otpmesh.describe(e.reason)[:70]})"
                incarnation = "" if e.incarnation is None else f" #{e.incarnation}"
                print(f"  {e.kind:<18} {e.child_path}{incarnation}{reason}")


if __name__ == "__main__":
    otpmesh.run(main)
