"""A process-group mesh taken over: the standby adopts the epoch its members formed (same
processes, same torch.distributed group, state intact) and the next break forms a higher one."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.test_takeover import Program, start_job

GROUP_JOB = """
import contextlib, json, os
import trio
import otpmesh
from otpmesh import ONE_FOR_ALL, Mesh, Supervisor


class Rank(otpmesh.Actor):
    def __init__(self) -> None:
        self.total = 0.0  # the sum of every all-reduce: state a re-formed group would lose

    @otpmesh.endpoint
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([otpmesh.group().rank + 1.0])
        dist.all_reduce(tensor)
        self.total += float(tensor.item())
        return self.total

    @otpmesh.endpoint
    def where(self) -> dict:
        return {"pid": os.getpid(), "epoch": otpmesh.group().epoch, "total": self.total}

    @otpmesh.endpoint
    def crash(self) -> None:
        raise RuntimeError("boom")


TREE = Supervisor("job", children=[Mesh(
    "dp", Rank, shape={"procs": 2}, strategy=ONE_FOR_ALL, intensity=5, period=60.0,
    process_group="gloo",
)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        dp = app.mesh("job/dp")
        if not standby:  # the active's group breaks once first: it runs epoch 2
            with contextlib.suppress(otpmesh.ActorError):
                await app.actor("job/dp/0").crash()
            await app.settled()
        print("where", json.dumps(list((await dp.where()).values())), flush=True)
        print("reduced", json.dumps(list((await dp.all_reduce()).values())), flush=True)
        if not standby:
            await trio.sleep_forever()
        with contextlib.suppress(otpmesh.ActorError):
            await app.actor("job/dp/0").crash()
        await app.settled()
        print("again", json.dumps(list((await dp.where()).values())), flush=True)
"""


def _values(program: Program, prefix: str) -> list:  # type: ignore[type-arg]
    return json.loads(program.wait_for(prefix).removeprefix(prefix))  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
def test_a_standby_adopts_a_process_groups_epoch_and_the_next_break_forms_a_higher_one(
    tmp_path: Path,
) -> None:
    job, state, active = start_job(tmp_path, GROUP_JOB)
    before = _values(active, "where ")
    assert _values(active, "reduced ") == [3.0, 3.0]
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    standby = Program(state, "--standby", program=job)
    after = _values(standby, "where ")
    # The same processes, the same epoch, the state of the all-reduce before the kill.
    assert [(r["pid"], r["epoch"]) for r in after] == [(r["pid"], 2) for r in before], after
    assert [rank["total"] for rank in after] == [3.0, 3.0]
    # The adopted group still all-reduces: its members' gloo pairs outlived the store.
    assert _values(standby, "reduced ") == [6.0, 6.0]
    again = _values(standby, "again ")  # rank 0 crashed: the group broke and formed anew
    assert [rank["epoch"] for rank in again] == [3, 3], again  # the journal's, plus one
    assert not {rank["pid"] for rank in again} & {rank["pid"] for rank in before}
    standby.finish()
    records = [json.loads(line) for line in (state / "journal").read_text().splitlines()]
    # The standby started the journal from a snapshot of the run it took over (_journal.py:
    # the group's last epoch there, if any), then journalled the one it adopted and the one
    # it formed.
    epochs = [r["epoch"] for r in records if r.get("group") == "job/dp"]
    assert epochs[-2:] == [2, 3] and epochs == sorted(epochs), epochs
