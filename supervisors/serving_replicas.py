"""Serving replicas: a one-for-one mesh of independent model replicas with a generous intensity.

    python supervisors/serving_replicas.py            # each replica in a worker process of its own
    python supervisors/serving_replicas.py --local    # every replica in this process

Use it for inference serving, batch generation or evaluation: N copies of the same model, one per
GPU, each answering requests on its own, with nothing shared between them.

The tree::

    replicas            Mesh  gpus=4, ONE_FOR_ONE, 2 x replicas restarts per 60 s
    └── 0 1 2 3         one Replica actor per GPU

Why one-for-one: replicas share no state and no collectives, so a crashed replica (a poison
request, an OOM on a long prompt, a GPU fault) is restarted on its own GPU while the others keep
serving with their warm caches; callers of the failed one retry, callers of the others never
notice. Route requests with ``mesh.endpoint.choose(...)``, which picks the least loaded replica.

Why a higher intensity than OTP's default (1 restart per 5 s): independent faults add up with the
number of replicas, and a serving fleet should absorb a burst of bad requests rather than give up
after the second one. The limit still matters: a replica that crashes on *every* request (a bad
model file, a broken driver) exhausts it, and then the mesh stops and its parent decides, instead
of restarting forever. Scale it with the replica count, as ``make_tree`` does.

``shutdown=10.0`` gives each replica ten seconds in ``on_stop`` to finish the requests it
already accepted (a graceful drain) before it is killed.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Iterable
from typing import Any, Literal

import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, Mesh


class Replica(otpmesh.Actor):
    """One copy of the model; its request count stands in for warm state (caches, graphs)."""

    def __init__(self) -> None:
        self.served = 0

    @otpmesh.endpoint
    async def generate(self, prompt: str) -> str:
        if "\x00" in prompt:
            raise UnicodeError("tokenizer choked on a NUL byte (a poison request)")
        self.served += 1
        await trio.sleep(0.001)  # the forward pass
        return f"{prompt}... (replica {otpmesh.context().rank})"

    @otpmesh.endpoint
    def requests_served(self) -> int:
        return self.served

    async def on_stop(self, reason: object) -> None:
        # A real replica drains here: finish accepted requests, flush metrics. `shutdown` bounds it.
        pass


def make_tree(*, replicas: int = 4, period: float = 60.0) -> Mesh:
    """`replicas` independent replicas; the mesh tolerates two restarts per replica per period."""
    return Mesh(
        "replicas",
        Replica,
        shape={"gpus": replicas},
        strategy=ONE_FOR_ONE,
        intensity=2 * replicas,
        period=period,
        shutdown=10.0,
    )


tree = make_tree()


# ---- the demo ----------------------------------------------------------------------------------


async def fault(app: otpmesh.App, call: Awaitable[Any]) -> list[otpmesh.LogEntry]:
    """Make a call that crashes its actor; return the supervision events it caused."""
    since = len(app.events)
    try:
        await call
    except otpmesh.ActorError as err:
        print(f"  the caller gets ActorError from {err.actor}: {err.type_name}: {err.message}")
    await app.settled()  # the exit is handled and the restarts it caused are done
    return list(app.events)[since:]


def print_events(entries: Iterable[otpmesh.LogEntry]) -> None:
    """One line per supervision step: time since the first, kind, path, #incarnation, reason."""
    entries = list(entries)
    t0 = entries[0].time if entries else 0.0
    for e in entries:
        incarnation = "" if e.incarnation is None else f"#{e.incarnation}"
        reason = "" if e.reason is None else str(e.reason)
        ms = (e.time - t0) * 1000
        print(f"  {ms:7.1f} ms  {e.kind:<26}{e.child_path:<18}{incarnation:<4}{reason}".rstrip())


async def main(placement: Literal["procs", "local"] = "procs") -> None:
    async with otpmesh.start(tree, placement=placement) as app:
        replicas = app.mesh("replicas")
        await replicas.generate("warm up")  # every replica once
        async with trio.open_nursery() as nursery:  # 12 concurrent requests, least loaded first
            for i in range(12):
                nursery.start_soon(replicas.generate.choose, f"request {i}")
        print(f"requests served per replica: {(await replicas.requests_served()).values()}")

        print("== a poison request crashes replica 1: only replica 1 restarts")
        print_events(await fault(app, replicas[1].generate("bad\x00prompt")))
        print(f"  requests served per replica: {(await replicas.requests_served()).values()}")

        # With OTP's default intensity (1 restart per 5 s) this second crash would stop the mesh.
        print("== a second poison request, on replica 3: the intensity absorbs it too")
        print_events(await fault(app, replicas[3].generate("bad\x00prompt")))
        print(f"  answers from every replica: {(await replicas.generate('hello')).values()}")


if __name__ == "__main__":
    otpmesh.run(main, "local" if "--local" in sys.argv[1:] else "procs")
