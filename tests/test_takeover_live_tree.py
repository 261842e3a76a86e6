"""A takeover resumes the tree that was running, not the one the program declares: real
processes, a real SIGKILL of the controller, a standby from the journal. The reference model's
takeover (tests/test_takeover_model.py) and the real OTP 25 supervisor across takeovers
(tests/test_supervisor_erlang.py) check every rule; this checks that the trio driver, the
journal and the placement carry them out."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.test_takeover import Program, start_job

LIVE_TREE_JOB = """
import argparse, contextlib, json, os
import trio
import otpmesh
from otpmesh import TEMPORARY, TRANSIENT, Supervisor, Worker
from tests.actors import Member

FLAGS = os.environ["FLAGS"]


class Flagged(Member):
    \"\"\"Its start fails while FLAGS/fail exists, and is ignored while FLAGS/ignore does.\"\"\"

    def __init__(self) -> None:
        if os.path.exists(os.path.join(FLAGS, "fail")):
            raise RuntimeError("set to fail")
        super().__init__()

    async def on_start(self) -> None:
        if os.path.exists(os.path.join(FLAGS, "ignore")):
            raise otpmesh.Ignore()


TREE = Supervisor(
    "job",
    intensity=5,
    period=600.0,
    children=[
        Worker("keep", Member),
        Worker("stopped", Member),
        Worker("deleted", Member),
        Worker("tmp", Member, restart=TEMPORARY),
        Worker("tr", Flagged, restart=TRANSIENT),
        Worker("ign", Flagged),
    ],
)


def flag(name: str) -> None:
    open(os.path.join(FLAGS, name), "w").close()


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        if not standby:
            await app.start_child("job", Worker("dyn", Member))
            await app.actor("job/keep").ping()  # state: a count the standby must find
            await app.terminate_child("job/stopped")
            await app.terminate_child("job/deleted")
            await app.delete_child("job/deleted")
            with contextlib.suppress(otpmesh.ActorError):
                await app.actor("job/tmp").crash()
            await app.actor("job/tr").quit("normal")  # transient, a normal exit: not restarted
            flag("ignore")
            with contextlib.suppress(otpmesh.ActorError):
                await app.actor("job/ign").crash()  # restarted, and its start is ignored
            await app.settled()
            flag("fail")  # a standby that started tr again would fail there
            os.remove(os.path.join(FLAGS, "ignore"))
            await app.settled()
            print("dyn pid", await app.actor("job/dyn").pid(), flush=True)
            await trio.sleep_forever()
        await app.settled()
        rows = [[c.id, c.status.value, c.incarnation] for c in app.which_children("job")]
        print("children", json.dumps(rows), flush=True)
        try:
            await app.restart_child("job/dyn")
        except otpmesh.ChildError as exc:
            print("restart_child dyn:", exc.outcome.value, flush=True)
        print("keep count", await app.actor("job/keep").count(), flush=True)
        kinds = [(e.kind.value, e.child) for e in app.events if e.child is not None]
        print("events", json.dumps(kinds), flush=True)
"""


@pytest.mark.timeout(240)
def test_a_standby_resumes_the_running_tree_as_otp_left_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38's cases in one tree, one SIGKILL: a child added by start_child is there (and
    running: restart_child says so), terminated and ignored children stay stopped, deleted and
    temporary ones stay gone, a transient one that exited normally is not started (its start
    would fail now: the takeover goes on), a child whose process died in the gap is restarted
    by its supervisor, and the rest are adopted with their state, logged as adopted."""
    flags = tmp_path / "flags"
    flags.mkdir()
    monkeypatch.setenv("FLAGS", str(flags))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent))
    job, state, active = start_job(tmp_path, LIVE_TREE_JOB)
    dyn_pid = int(active.wait_for("dyn pid").split()[-1])
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    os.kill(dyn_pid, signal.SIGKILL)  # died while no controller ran
    standby = Program(state, "--standby", program=job)
    lines = standby.finish()
    rows = json.loads(next(line for line in lines if line.startswith("children "))[9:])
    assert rows == [
        ["dyn", "running", 2],  # lost in the gap, restarted: permanent
        ["ign", "undefined", 1],
        ["tr", "undefined", 1],
        ["stopped", "undefined", 1],
        ["keep", "running", 1],
    ], lines
    assert "restart_child dyn: running" in lines
    assert "keep count 2" in lines  # its ping before, and this call
    events = [tuple(e) for e in json.loads(next(x for x in lines if x.startswith("events "))[7:])]
    assert ("child_adopted", "keep") in events and ("child_adopted", "dyn") not in events
    assert not any(kind == "child_started" and child != "dyn" for kind, child in events), events
    assert ("child_exited", "dyn") in events


OWNED_JOB = """
import json
import trio
import otpmesh
from otpmesh import Supervisor, Worker


class Level(otpmesh.Actor):
    \"\"\"Owns a subtree with one Level one deeper, down to `depth` 0.\"\"\"

    def __init__(self, depth: int) -> None:
        self.depth, self.count, self.sub = depth, 0, None

    async def on_start(self) -> None:
        if self.depth:
            spec = Supervisor("sub", children=[Worker("n", Level, args=(self.depth - 1,))])
            self.sub = await otpmesh.context().start(spec)

    @otpmesh.endpoint
    async def bump(self) -> list[list[object]]:
        \"\"\"Count one here and below; each level's path, pid and count.\"\"\"
        self.count += 1
        below = await self.sub.actor(self.sub.root + "/n").bump() if self.sub else []
        import os
        return [[otpmesh.context().path, os.getpid(), self.count], *below]


TREE = Supervisor("job", children=[Worker("top", Level, args=(3,))])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        for _ in range(4 if not standby else 1):
            levels = await app.actor("job/top").bump()
        print("levels", json.dumps(levels), flush=True)
        if not standby:
            await trio.sleep_forever()
"""


@pytest.mark.timeout(240)
def test_an_owned_subtree_three_levels_deep_survives_a_takeover_with_its_state_and_pids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the standby adopted the owner and said its subtrees were not taken over: their
    actors ran on unsupervised until the grace period ended."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent))
    job, state, active = start_job(tmp_path, OWNED_JOB)
    before = json.loads(active.wait_for("levels")[7:])
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    standby = Program(state, "--standby", program=job)
    lines = standby.finish()
    after = json.loads(next(line for line in lines if line.startswith("levels "))[7:])
    assert [path for path, _, _ in before] == [
        "job/top",
        "job/top/sub/n",
        "job/top/sub/n/sub/n",
        "job/top/sub/n/sub/n/sub/n",
    ]
    # The same processes, each count one past where the dead controller left it.
    assert after == [[path, pid, count + 1] for path, pid, count in before], lines
    assert not any("not taken over" in line for line in lines), lines


SINGLETON_JOB = """
import os
import trio
import otpmesh
from otpmesh import Supervisor, Worker
from tests.actors import Member


TREE = Supervisor("job", children=[Worker("w", Member)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover):
        counter = await otpmesh.singleton("counter", Member)
        for _ in range(3 if not standby else 1):
            count = await counter.count()
        print("counter", count, await counter.pid(), flush=True)
        if not standby:
            await trio.sleep_forever()
"""


@pytest.mark.timeout(240)
def test_a_singleton_is_resumed_with_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent))
    job, state, active = start_job(tmp_path, SINGLETON_JOB)
    _, count, pid = active.wait_for("counter").split()
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    standby = Program(state, "--standby", program=job)
    lines = standby.finish()
    assert f"counter {int(count) + 1} {pid}" in lines, lines  # one more, in the same process
    assert not any("not taken over" in line for line in lines), lines


MESH_JOB = """
import trio
import otpmesh
from otpmesh import Supervisor, Worker
from tests.owned_actors import Spawner


TREE = Supervisor("job", children=[Worker("sp", Spawner)])


async def main(state: str, standby: bool) -> None:
    takeover = otpmesh.Takeover(dir=state, grace=60.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        kids = await app.actor("job/sp").kids()
        print("kids", sorted((await kids.pid()).values()), flush=True)
        if not standby:
            await trio.sleep_forever()
"""


@pytest.mark.timeout(240)
def test_a_mesh_an_actor_spawned_on_a_proc_mesh_runs_on_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not taken over yet: said in one line; its actors are left running (their owner, adopted,
    still calls them), not stopped as a start under way would be."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent))
    job, state, active = start_job(tmp_path, MESH_JOB)
    before = active.wait_for("kids")
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    standby = Program(state, "--standby", program=job)
    lines = standby.finish()
    assert before in lines, lines  # the same processes answer the adopted owner
    said = [line for line in lines if "not taken over" in line]
    assert len(said) == 1 and "job/sp/kids" in said[0] and "run on" in said[0], lines
