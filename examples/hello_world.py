"""Hello world: the smallest otpmesh controller program.

One controller process starts a mesh of 4 worker processes, spawns an actor on each, and calls
an endpoint on all of them (broadcast) and on one of them (unicast).

    python examples/hello_world.py
"""

from __future__ import annotations

import otpmesh


class Greeter(otpmesh.Actor):
    def __init__(self, greeting: str) -> None:
        # The constructor runs inside the actor's own worker process.
        self.greeting = greeting

    @otpmesh.endpoint
    async def hello(self, name: str) -> str:
        ctx = otpmesh.context()
        return f"{self.greeting}, {name}! from {ctx.path} at {ctx.coords}"


async def main() -> None:
    procs = await otpmesh.proc_mesh(procs=4)
    greeters = await procs.spawn("greeters", Greeter, "Hello")

    everyone = await greeters.hello("world")  # every actor: a ValueMesh back
    for line in everyone:
        print(line)

    one = await greeters[2].hello("rank two")  # one actor: one value back
    print(one)
    await procs.stop()


if __name__ == "__main__":
    otpmesh.run(main)
