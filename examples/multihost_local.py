"""A mesh on 2 hosts, on one machine: the local launcher starts one host agent per "host".

Each agent dials the controller over TCP (authenticated with the cluster secret, created in
~/.otpmesh/secret on first use), forks its host's workers, and relays broadcasts to them. Then
host 1's agent is SIGKILLed: its actors exit with a reason naming the host, and their supervisor
restarts them on the host that is left (the same run across machines uses ``launchers.SSH``,
``launchers.Slurm`` or ``launchers.Static``; see docs/multihost.md).

    python examples/multihost_local.py
"""

from __future__ import annotations

import os
import signal

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, LogKind, Mesh, Supervisor, launchers


class Rollout(otpmesh.Actor):
    @otpmesh.endpoint
    def where(self) -> str:
        ctx = otpmesh.context()
        return f"{ctx.path} on host {os.environ.get('OTPMESH_HOST')} (pid {os.getpid()})"


tree = Supervisor(
    "rl",
    strategy=ONE_FOR_ONE,
    children=[
        Mesh("rollouts", Rollout, shape={"hosts": 2, "procs": 2}, strategy=ONE_FOR_ONE, intensity=4)
    ],
)


async def main() -> None:
    launcher = launchers.Local(hosts=2)
    async with otpmesh.cluster(launcher) as hosts, otpmesh.start(tree) as app:
        print(f"controller at {hosts.address}; hosts: {[h.name for h in hosts.live]}")
        rollouts = app.mesh("rl/rollouts")
        for line in (await rollouts.where()).values():  # one send per host, relayed by its agent
            print(" ", line)
        print("unicast:", await rollouts[3].where())

        print("== SIGKILL host local1's agent: the host is gone, with its workers")
        since = len(app.events)
        os.kill(launcher.processes[1].pid, signal.SIGKILL)
        with trio.fail_after(15):
            while sum(e.kind == LogKind.CHILD_STARTED for e in list(app.events)[since:]) < 2:
                await trio.sleep(0.05)
        for e in list(app.events)[since:]:
            if e.kind in (LogKind.CHILD_EXITED, LogKind.CHILD_STARTED):
                print(f"  {e.kind:<14} {e.child_path:<14} #{e.incarnation}  {e.reason or ''}")
        for line in (await rollouts.where()).values():
            print(" ", line)


if __name__ == "__main__":
    otpmesh.run(main)
