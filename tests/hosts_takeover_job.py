"""The job tests/test_takeover_hosts.py runs twice (active and standby), each in a network
namespace of its own: 4 counters on 2 agent hosts, a driver that sends numbered steps, a
takeover across hosts. Not a test module itself (no test_ prefix)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

import otpmesh
from otpmesh import Mesh, Supervisor, launchers


class Counter(otpmesh.Actor):
    def __init__(self) -> None:
        self.step = 0
        self.total = 0
        self.seen: list[list[int]] = []  # [step, pid of the controller that sent it]

    @otpmesh.endpoint
    async def add(self, step: int, sender: int) -> int:
        self.seen.append([step, sender])
        if step == self.step:  # a resumed driver may send a step again: applied once
            self.total += step
            self.step += 1
        return self.step

    @otpmesh.endpoint
    async def state(self) -> dict[str, object]:
        return {"pid": os.getpid(), "step": self.step, "total": self.total, "seen": self.seen}


TREE = Supervisor("job", children=[Mesh("counters", Counter, shape={"hosts": 2, "procs": 2})])


def _write(path: str, value: object) -> None:
    with open(f"{path}.tmp", "w") as f:
        json.dump(value, f)
    os.replace(f"{path}.tmp", path)


async def main(args: argparse.Namespace) -> None:
    hosts = otpmesh.TakeoverHosts(launchers.Static(hosts=2), listen=args.listen, port=args.port)
    takeover = otpmesh.Takeover(dir=args.dir, grace=args.grace, standby=args.standby, hosts=hosts)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        counters = app.mesh("job/counters")
        states = (await counters.state()).values()
        _write(f"{args.out}.{os.getpid()}.start", states)
        step = min(s["step"] for s in states)
        while step < args.steps:
            await counters.add(step, os.getpid())
            step += 1
            _write(f"{args.out}.progress", step)
            await trio.sleep(0.02)
        _write(args.out, {"controller": os.getpid(), "states": (await counters.state()).values()})


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--standby", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    otpmesh.run(main, args)
