"""Actors that own meshes, for tests/test_owned.py (importable by worker processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import otpmesh
from otpmesh import ONE_FOR_ONE, Actor, Mesh, endpoint


class Replica(Actor):
    def __init__(self, tag: str = "r", stopped_dir: str | None = None) -> None:
        self.tag = tag
        self.calls = 0
        self.stopped_dir = stopped_dir

    async def on_stop(self, reason: object) -> None:
        if self.stopped_dir is not None:
            path = otpmesh.context().path.replace("/", "_")
            Path(self.stopped_dir, path).write_text(str(reason))

    @endpoint
    async def who(self) -> list[Any]:
        self.calls += 1
        return [otpmesh.context().path, os.getpid(), self.tag, self.calls]

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint(let_it_crash=True)  # crashes it, supervised or not
    async def crash(self) -> None:
        raise RuntimeError("replica crashed on purpose")

    @endpoint
    def wedge(self) -> None:
        time.sleep(3600)  # only its progress deadline gets it out


class Service(Actor):
    """Owns a declared ONE_FOR_ONE subtree of replicas, started in on_start."""

    def __init__(self, replicas: int = 2, intensity: int = 10, deadline: float | None = None):
        self.replicas = replicas
        self.intensity = intensity
        self.deadline = deadline

    async def on_start(self) -> None:
        spec = Mesh(
            "replicas",
            Replica,
            shape={"procs": self.replicas},
            strategy=ONE_FOR_ONE,
            intensity=self.intensity,
            period=60.0,
            progress_deadline=self.deadline,
        )
        self.sub = await otpmesh.context().start(spec)

    @endpoint
    async def replicas_mesh(self) -> otpmesh.ActorMesh:
        return self.sub.mesh()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def crash(self) -> None:
        raise RuntimeError("service crashed on purpose")

    @endpoint
    def wedge(self) -> None:
        time.sleep(3600)

    @endpoint
    async def fan(self) -> list[Any]:
        return list((await self.sub.mesh().who()).values())


class Spawner(Actor):
    """Owns an imperative proc mesh with an unsupervised actor mesh; maybe a deeper owner."""

    def __init__(self, handled: bool | None = None, deep: bool = False) -> None:
        self.handled = handled  # None: no __supervise__ behaviour (the hook says not handled)
        self.failures: list[str] = []
        self.deep = deep

    async def on_start(self) -> None:
        self.procs = await otpmesh.proc_mesh(procs=2)
        cls = Spawner if self.deep else Replica
        self.mesh = await self.procs.spawn("kids", cls)

    async def __supervise__(self, failure: otpmesh.MeshFailure) -> bool:
        self.failures.append(str(failure))
        if self.handled:  # replace the failed mesh: the owner lives on
            self.mesh = await self.procs.spawn(f"kids{len(self.failures)}", Replica)
            return True
        return False

    @endpoint
    async def kids(self) -> otpmesh.ActorMesh:
        return self.mesh

    @endpoint
    async def procs_handle(self) -> Any:
        return self.procs

    @endpoint
    async def failures_seen(self) -> list[str]:
        return self.failures

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def all_pids(self) -> list[int]:
        """This process and every process this actor owns, at any depth."""
        pids = [os.getpid()]
        if self.deep:
            for below in (await self.mesh.all_pids()).values():
                pids += below
        else:
            pids += self.procs.pids
        return pids


class Finder(Actor):
    """Finds other actors of the app by path, and its singleton."""

    @endpoint
    async def ask(self, path: str) -> list[Any]:
        ref = await otpmesh.lookup(path)
        return (
            list((await ref.who()).values())
            if isinstance(ref, otpmesh.ActorMesh)
            else [await ref.who()]
        )

    @endpoint
    async def stop_found(self, path: str) -> None:
        found = await otpmesh.lookup(path)
        assert isinstance(found, otpmesh.ActorMesh)
        await found.stop()

    @endpoint
    async def registry(self) -> list[Any]:
        ref = await otpmesh.singleton("registry", Replica, "single")
        return await ref.who()

    @endpoint
    async def singleton_of(self, name: str, actor: str, *args: Any) -> list[Any]:
        """Singleton `name` asked for as class `actor` (an import path): what it answers to
        who(), or the error this process got and its message."""
        try:
            ref = await otpmesh.singleton(name, actor, *args)
        except otpmesh.OtpmeshError as exc:
            return [type(exc).__name__, str(exc)]
        return await ref.who()


class Forker(Actor):
    """Starts proc meshes of its own on request (their processes count against its bound)."""

    def __init__(self) -> None:
        self.meshes: list[otpmesh.ProcMeshRef] = []

    @endpoint
    async def fork(self, n: int) -> int:
        mesh = await otpmesh.proc_mesh(procs=n)
        self.meshes.append(mesh)
        return len(mesh)

    @endpoint
    async def fork_slice(self) -> int:
        view = self.meshes[-1].slice(procs=0)  # a slice: no new process
        self.meshes.append(view)
        return len(view)

    @endpoint
    async def stop_first(self) -> None:
        await self.meshes.pop(0).stop()
