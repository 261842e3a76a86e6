"""Pipeline stages: rest-for-one over stage workers, so a failed stage restarts with the later ones.

    python supervisors/pipeline_stages.py            # each stage in a worker process of its own
    python supervisors/pipeline_stages.py --local    # every stage in this process, same supervision

Use it where data flows one way through stages, each consuming what the one before produced:
pipeline-parallel *inference* (stage k holds layers k*L/N .. (k+1)*L/N and sends activations on to
k+1), or a data pipeline such as load -> tokenize -> embed -> index.

The tree::

    pipeline            Supervisor  REST_FOR_ONE, 3 restarts per 60 s
    ├── stage0          Worker      first layers (or the loader)
    ├── stage1          Worker
    ├── stage2          Worker
    └── stage3          Worker      last layers (or the sink)

Why rest-for-one: everything downstream of a failed stage holds state derived from it: the
activations and micro-batches in flight, KV caches filled from its outputs, the point in the
stream it had reached, and the send/recv links (NCCL peer-to-peer) to it. So stage k and every
stage after it restart together and resume from one consistent point; the stages *before* k did
nothing wrong and keep their state (a loader keeps its position in the dataset, earlier stages keep
their warm caches). A failure of the last stage restarts only the last stage.

Pipeline-parallel *training* is different: gradients flow backwards too, so an early stage depends
on the later ones as much as they depend on it, and all stages take every optimizer step
together. Use ALL_FOR_ONE there (see ``data_parallel.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Iterable
from typing import Any, Literal

import otpmesh
from otpmesh import REST_FOR_ONE, Supervisor, Worker


class Stage(otpmesh.Actor):
    """One stage: transforms a micro-batch and remembers how far into the stream it got."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.position = 0  # micro-batches processed: the state a restart loses

    @otpmesh.endpoint
    def forward(self, batch: list[float]) -> list[float]:
        if not batch:
            raise ValueError(f"stage {self.index} got an empty micro-batch")
        self.position += 1
        return [x * 2 + self.index for x in batch]

    @otpmesh.endpoint
    def position_in_stream(self) -> int:
        return self.position


def make_tree(*, stages: int = 4, intensity: int = 3, period: float = 60.0) -> Supervisor:
    """`stages` stage workers, ``stage0`` .. ``stage{stages-1}``, in data-flow order."""
    return Supervisor(
        "pipeline",
        strategy=REST_FOR_ONE,
        intensity=intensity,
        period=period,
        children=[Worker(f"stage{i}", Stage, args=(i,)) for i in range(stages)],
    )


tree = make_tree()


# ---- the demo ----------------------------------------------------------------------------------


def stage_refs(app: otpmesh.App) -> list[otpmesh.ActorRef]:
    return [app.actor(f"pipeline/{child.id}") for child in tree.children]


async def run_through(app: otpmesh.App, batch: list[float]) -> list[float]:
    """Send one micro-batch through every stage in order (the controller relays activations)."""
    for stage in stage_refs(app):
        batch = await stage.forward(batch)
    return batch


async def positions(app: otpmesh.App) -> list[int]:
    return [await stage.position_in_stream() for stage in stage_refs(app)]


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
        for step in range(3):
            await run_through(app, [float(step), 1.0])
        print(f"stream position per stage: {await positions(app)}")

        print("== stage1 fails: stage1, stage2 and stage3 restart; stage0 keeps its position")
        stage1 = app.actor("pipeline/stage1")
        print_events(await fault(app, stage1.forward([])))
        print(f"  stream position per stage: {await positions(app)}")

        await run_through(app, [3.0, 1.0])
        print("== the last stage fails: only it restarts")
        stage3 = app.actor("pipeline/stage3")
        print_events(await fault(app, stage3.forward([])))
        print(f"  stream position per stage: {await positions(app)}")


if __name__ == "__main__":
    otpmesh.run(main, "local" if "--local" in sys.argv[1:] else "procs")
