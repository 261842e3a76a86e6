"""The doors a takeover opens, attacked: an actor that knows the app's secret cannot fence its
fork server while its controller lives, nothing in the state directory lets a reader join the
app, and a same-user process squatting the lease is named by the standby (real apps, real
processes, real SIGKILLs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import FencedError, Supervisor, Takeover, TakeoverError, Worker
from otpmesh._controller._takeover import resume
from otpmesh._core._errors import ActorError
from otpmesh._node._node import Node, current_node
from otpmesh._runtime._appkey import unwrap, wrap
from otpmesh._runtime._forkstandby import dial_standby
from otpmesh._wire._secret import load_secret
from tests.test_takeover import Program, _journal

KEY = b"k" * 32


@pytest.fixture(autouse=True)
def _no_program_left() -> Iterator[None]:
    yield
    programs, Program.started = Program.started, []
    for program in programs:
        program.end()


class Intruder(otpmesh.Actor):
    """A compromised actor: it has its worker's copy of the app's secret."""

    @otpmesh.endpoint
    async def fence(self, sock: str) -> str:
        node = current_node()
        assert node is not None
        try:
            await dial_standby(sock, node.secret, 2**40)
        except FencedError as exc:
            return str(exc)
        return "attached"

    @otpmesh.endpoint
    async def pid(self) -> int:
        return os.getpid()


TREE = Supervisor("app", children=[Worker("intruder", Intruder), Worker("other", Intruder)])


@pytest.mark.timeout(120)
def test_an_actor_with_the_secret_cannot_fence_its_fork_server_and_the_app_goes_on(
    tmp_path: Path,
) -> None:
    """Before, the fork server attached the actor at epoch 2**40 while its controller was
    attached: the controller was told it was fenced, marked every worker dead, and every
    restart failed with SpawnError until the root gave up."""

    async def main() -> None:
        takeover = Takeover(dir=tmp_path / "state", key=KEY)
        async with otpmesh.start(TREE, takeover=takeover) as app:
            said = await app.actor("app/intruder").fence(str(tmp_path / "state/forkserver.sock"))
            assert "its controller is attached" in said
            other = app.actor("app/other")
            old = await other.pid()
            os.kill(old, signal.SIGKILL)  # a restart needs a fork: the fork server is still ours
            with trio.fail_after(60):
                while True:
                    try:
                        new = await other.pid()
                    except (otpmesh.ActorError, otpmesh.ActorDiedError):
                        await trio.sleep(0.05)
                        continue
                    if new != old:
                        break
            children = {child.id: child for child in app.which_children("app")}
            assert children["other"].incarnation == 2

    trio.run(main)


@pytest.mark.timeout(120)
def test_nothing_in_the_state_directory_holds_the_apps_secret(tmp_path: Path) -> None:
    """Before, the journal's app record held the secret in hex: a same-user process told only
    the directory read it and joined (or fenced) the app."""
    state = tmp_path / "state"

    async def main() -> bytes:
        async with otpmesh.start(TREE, takeover=Takeover(dir=state, key=KEY)) as app:
            await app.actor("app/intruder").pid()
            node = current_node()
            assert node is not None
            return node.secret

    secret = trio.run(main)
    for path in state.iterdir():
        data = path.read_bytes()
        assert secret not in data and secret.hex().encode() not in data, path.name
    app = next(json.loads(line) for line in (state / "journal").read_text().splitlines())
    assert "secret" not in app
    assert unwrap(KEY, app) == secret  # the key, kept elsewhere, is what a standby needs
    with pytest.raises(TakeoverError, match="under another key"):
        unwrap(b"x" * 32, app)


def test_a_standby_with_another_key_is_refused_before_it_fences_anything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    record = {"app": 1, "epoch": 1, **wrap(KEY, b"s" * 32), "boot": ""}
    (state / "journal").write_text(json.dumps(record) + "\n")
    os.chmod(state / "journal", 0o600)

    async def main() -> None:
        with pytest.raises(TakeoverError, match="kept its secret under another key"):
            await resume(Takeover(dir=state, key=b"other key, 16+ bytes"), TREE)

    trio.run(main)
    assert not (state / "epoch").exists()  # no epoch bumped: nothing fenced


def test_the_default_key_is_the_users_otpmesh_secret() -> None:
    assert unwrap(load_secret(create=True), wrap(load_secret(), b"abc")) == b"abc"


@pytest.mark.parametrize("key", [b"short", "a string", 16])
def test_a_key_must_be_16_bytes_or_more(key: object) -> None:
    with pytest.raises(ValueError, match=r"Takeover\(key=\.\.\.\)"):
        Takeover(dir="/tmp/x", key=key)  # type: ignore[arg-type]


_SQUAT = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
def test_a_standby_names_a_process_squatting_the_lease_and_takes_over_once_it_goes(
    tmp_path: Path,
) -> None:
    """A same-user process without the secret takes the lease the dead controller left: the
    standby says which pid holds it, and takes the run over (every worker kept) once that
    process is gone. Before, the standby polled in silence until the grace ended and every
    worker was lost."""
    state = tmp_path / "state"
    active = Program(state, "--steps", "40", "--pause", "0.05", "--grace", "90")
    active.wait_for("step 5")
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    squatter = subprocess.Popen(
        [sys.executable, "-c", _SQUAT, str(state / "lease")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "held\n"
        standby = Program(state, "--steps", "40", "--pause", "0.01", "--standby")
        named = standby.wait_for("takeover: the lease")
        assert f"is held by pid {squatter.pid} " in named, named
    finally:
        squatter.kill()
        squatter.wait()
    started = standby.wait_for("driver (pid")
    assert "incarnations [1, 1, 1, 1]" in started  # taken over, not started afresh
    standby.finish()


@pytest.mark.timeout(240)
def test_a_process_with_the_secret_but_not_the_lease_cannot_adopt_a_worker_in_the_gap(
    tmp_path: Path,
) -> None:
    """After the controller's death, a process that knows the app's secret (as an actor does)
    asks a worker to take it as its controller at a higher epoch: refused, as it does not hold
    the lease; the standby then adopts every worker. Before, the worker took it, and the
    standby found that worker fenced off."""
    state = tmp_path / "state"
    active = Program(state, "--steps", "40", "--pause", "0.05", "--grace", "90")
    active.wait_for("step 5")
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    records = _journal(state)
    app = next(r for r in records if "app" in r)
    proc = next(r for r in records if "proc" in r and "actor" not in r)

    async def intrude() -> str:
        node = Node("intruder", secret=unwrap(load_secret(), app))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            conn = await node.connect(proc["addr"])
            payload = {"epoch": 99, "addr": node.addr, "pid": os.getpid()}
            with pytest.raises(ActorError) as refused:
                await node.sys_call(conn, "adopt", payload, proc["proc"])
            nursery.cancel_scope.cancel()
        return refused.value.message

    assert "does not hold the takeover's lease" in trio.run(intrude)
    standby = Program(state, "--steps", "40", "--pause", "0.01", "--standby")
    assert "incarnations [1, 1, 1, 1]" in standby.wait_for("driver (pid")
    standby.finish()


@pytest.mark.timeout(240)
def test_a_takeover_is_said_in_one_line_and_the_driver_can_ask_app_resumed(tmp_path: Path) -> None:
    """Before, the standby said nothing, and its driver could not tell a resume from a start
    (the example's step counter was the only hint)."""
    state = tmp_path / "state"
    active = Program(state, "--steps", "40", "--pause", "0.05", "--grace", "90")
    assert not any(line.startswith("resumed:") for line in [active.wait_for("step 3")])
    active.proc.send_signal(signal.SIGKILL)
    active.proc.wait(10)
    os.kill(_worker_pid(state, 2), signal.SIGKILL)  # one actor lost in the gap
    standby = Program(state, "--steps", "40", "--pause", "0.01", "--standby")
    said = standby.said("takeover: epoch 2 took the tree over")
    resumed = standby.wait_for("resumed: ")
    expected = f"from pid {active.proc.pid} after "
    assert expected in said and expected in resumed
    assert resumed.endswith("3 actors adopted in 3 processes, 1 lost in the gap"), resumed
    standby.finish()


def _worker_pid(state: Path, rank: int) -> int:
    return int(
        next(
            r["pid"]
            for r in _journal(state)
            if "proc" in r and "actor" not in r and r["rank"] == rank
        )
    )


OWNER_JOB = """
import os, trio, otpmesh
from otpmesh import Supervisor, Worker
from tests.router_actors import Router

TREE = Supervisor("svc", children=[Worker("router", Router)])


async def main() -> None:
    standby = os.environ.get("STANDBY") == "1"
    takeover = otpmesh.Takeover(dir=os.environ["STATE"], grace=20.0, standby=standby)
    async with otpmesh.start(TREE, takeover=takeover) as app:
        await app.actor("svc/router").pids()
        print("running", app.resumed is not None, flush=True)
        await trio.sleep(0 if standby else 60)


if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.mark.timeout(120)
def test_a_standby_resumes_owned_subtrees_and_names_those_whose_owner_died(
    tmp_path: Path,
) -> None:
    """A router's engines (a tree it owns) are resumed with it; killed with its process in
    the gap, the router is restarted and starts engines of its own, and the standby says in
    one line that the old ones were not taken over (their actors are stopped). Before, no
    owned subtree was taken over, and their actors ran on unsupervised."""
    script = tmp_path / "owner_job.py"
    script.write_text(OWNER_JOB)
    env = dict(
        os.environ, STATE=str(tmp_path / "state"), PYTHONPATH=str(Path(__file__).parent.parent)
    )

    def killed_active() -> None:
        active = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert active.stdout is not None and active.stdout.readline() == "running False\n"
        finally:
            active.send_signal(signal.SIGKILL)
            active.wait(10)

    def standby() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script)],
            env=dict(env, STANDBY="1"),
            capture_output=True,
            text=True,
            timeout=90,
        )

    killed_active()
    done = standby()
    assert done.returncode == 0, done.stderr
    assert "running True" in done.stdout
    assert "not taken over" not in done.stderr, done.stderr

    killed_active()
    records = _journal(tmp_path / "state")
    proc = next(r["proc"] for r in records if r.get("actor") == "svc/router")
    os.kill(next(r["pid"] for r in records if r.get("proc") == proc and "pid" in r), 9)
    done = standby()
    assert done.returncode == 0, done.stderr
    assert "running True" in done.stdout
    said = [line for line in done.stderr.splitlines() if "not taken over" in line]
    assert len(said) == 1 and "svc/router/engines (its owner svc/router did not" in said[0], (
        done.stderr
    )
