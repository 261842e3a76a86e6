"""Hangs become supervision events: an endpoint past its progress deadline exits as ``Hung``
with its stacks and is restarted; ``otpmesh.progress()`` keeps a long one alive; ``app.stacks()``
and ``otpmesh stacks`` show what every actor is doing. Real worker processes throughout.

No assertion here is about speed (the time from a deadline to the restart is measured by
``otpmesh bench``); the 30 s guards only stop a test that would otherwise hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Mesh, Supervisor, Worker, chaos
from tests.conftest import run_trio
from tests.hang_actors import Stuck


def _exits(app: otpmesh.App) -> list[object]:
    return [e.reason for e in app.events.of_kind(LogKind.CHILD_EXITED)]


@pytest.mark.parametrize(
    ("endpoint", "how"),
    [
        ("spin_forever", "its process was killed"),  # a Python loop blocks the event loop
        ("async_spin_forever", "its process was killed"),  # so does one in an async def
        ("sleep_forever", "its process was killed"),  # so does C code that released the GIL
        ("await_forever", "ran past its progress deadline"),  # cancelled through trio
        ("thread_forever", "its process was killed"),  # awaits a thread: cancelling cannot end it
    ],
)
def test_a_stuck_endpoint_exits_hung_with_its_stack_and_is_restarted(
    endpoint: str, how: str
) -> None:
    tree = Supervisor("s", children=[Worker("w", Stuck, progress_deadline=0.5)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            w = app.actor("s/w")
            first = await w.incarnation_pid()
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError) as caught:
                await getattr(w, endpoint)()
            assert endpoint in str(caught.value)  # the caller is told where it was stuck
            assert caught.value.delivered is not False  # it reached the actor: never resent
            await app.settled()
            assert await w.incarnation_pid() != first or endpoint == "await_forever"
            assert await w.ping() == "pong"
            [reason] = _exits(app)
            assert isinstance(reason, otpmesh.Hung)
            assert reason.endpoint == endpoint and reason.seconds == 0.5
            assert how in reason.how
            assert f"at {endpoint} (" in reason.stacks  # the stuck frame, with its source line
            assert "hang_actors.py" in reason.stacks
            assert endpoint in otpmesh.describe(reason)

    run_trio(body, timeout=60)


def test_progress_keeps_a_long_endpoint_alive_and_an_endpoint_deadline_overrides_the_spec() -> None:
    # A 3 s deadline against steps of 0.1 s: a step may run 30 times late on a loaded machine.
    tree = Supervisor("s", children=[Worker("w", Stuck, progress_deadline=3.0)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            w = app.actor("s/w")
            # 40 steps of 0.1 s: 4 s in all, past the deadline, but it says it progresses.
            assert await w.steady(40, 0.1) == 40
            assert await w.short_fuse(0.0) == "done"
            # Its own 0.5 s deadline, not the spec's 3 s: 2 s asleep is too long.
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError):
                await w.short_fuse(2.0)
            await app.settled()
            [reason] = _exits(app)
            assert isinstance(reason, otpmesh.Hung)
            assert (reason.endpoint, reason.seconds) == ("short_fuse", 0.5)

    run_trio(body, timeout=60)


def test_without_a_deadline_a_long_endpoint_is_left_alone() -> None:
    tree = Supervisor("s", children=[Worker("w", Stuck)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            assert await app.actor("s/w").nap(1.0) == "rested"
            assert not _exits(app)

    run_trio(body, timeout=60)


def test_an_async_endpoint_in_the_controller_is_cancelled_at_its_deadline() -> None:
    tree = Supervisor("s", children=[Worker("w", Stuck, progress_deadline=0.5)])

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            w = app.actor("s/w")
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError):
                await w.await_forever()
            await app.settled()
            [reason] = _exits(app)
            assert isinstance(reason, otpmesh.Hung) and reason.endpoint == "await_forever"
            assert await w.ping() == "pong"

    run_trio(body, timeout=60)


def test_chaos_wedge_is_caught_by_the_deadline_and_its_stack_shows_the_wedge() -> None:
    tree = Supervisor("s", children=[Worker("w", Stuck, progress_deadline=0.5)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            w = app.actor("s/w")
            fault = await chaos.wedge(app, "s/w")
            assert fault.hit
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError):
                await w.ping()  # the next call wedges
            await app.settled()
            [reason] = _exits(app)
            assert isinstance(reason, otpmesh.Hung) and reason.endpoint == "ping"
            assert "at chaos_wedge (" in reason.stacks
            assert await w.ping() == "pong"  # the next incarnation is not wedged

    run_trio(body, timeout=60)


def test_stacks_group_identical_actors() -> None:
    tree = Supervisor("s", children=[Mesh("m", Stuck, shape={"procs": 3}), Worker("w", Stuck)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/m")
            async with trio.open_nursery() as nursery:
                for rank in range(3):
                    nursery.start_soon(mesh.slice(procs=rank).with_timeout(30).sleep_forever)
                nursery.start_soon(app.actor("s/w").with_timeout(30).await_forever)
                with trio.fail_after(30):
                    while True:  # until all four are inside their endpoints
                        stacks = await app.stacks()
                        inside = [s for s in stacks.actors.values() if "endpoint " in s]
                        if len(inside) == 4:
                            break
                        await trio.sleep(0.05)
                groups = stacks.groups()
                assert groups[0][1] == ["s/m/0", "s/m/1", "s/m/2"]
                assert "at sleep_forever (" in groups[0][0]
                assert "at await_forever (" in stacks.actors["s/w"]
                assert "3 actors: s/m/0, s/m/1, s/m/2" in str(stacks)
                assert set((await app.stacks("s/m")).actors) == {"s/m/0", "s/m/1", "s/m/2"}

                # The command line asks this very process (the app's controller).
                out = await trio.run_process(
                    [sys.executable, "-m", "otpmesh", "stacks", str(os.getpid()), "--path", "s/w"],
                    capture_stdout=True,
                    capture_stderr=True,
                )
                text = out.stdout.decode()
                assert "1 actor: s/w" in text and "await_forever" in text
                assert "s/m/0" not in text
                wrong = await trio.run_process(
                    [sys.executable, "-m", "otpmesh", "stacks", str(os.getpid()), "--path", "nope"],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                assert wrong.returncode == 2, wrong
                assert "--path 'nope': no actor of app" in wrong.stderr.decode()
                assert "(its actors: s/m/0, s/m/1, s/m/2, s/w)" in wrong.stderr.decode()
                nursery.cancel_scope.cancel()

    run_trio(body, timeout=90)


def test_stacks_name_a_stopped_process_as_not_answering() -> None:
    # A generous heartbeat timeout: the stopped worker must not be replaced while it is asked.
    tree = Supervisor("s", children=[Worker("z", Stuck)])

    async def body() -> None:
        async with otpmesh.start(tree, heartbeat_timeout=30.0) as app:
            pid = await app.actor("s/z").incarnation_pid()
            assert (await app.stacks()).actors == {"s/z": "idle"}
            os.kill(pid, signal.SIGSTOP)
            try:
                with trio.fail_after(30):  # until the kernel says it is stopped
                    while _state(pid) not in ("T", "t"):
                        await trio.sleep(0.01)
                stacks = await app.stacks()
            finally:
                os.kill(pid, signal.SIGCONT)
            events = [str(e) for e in app.events]
            assert "no answer within 1 s" in stacks.actors["s/z"], (stacks, pid, events)
            assert (await app.stacks()).actors == {"s/z": "idle"}  # it answers again

    run_trio(body, timeout=90)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _stacks_of_a_bystander(
    runtime: Path | None = None, marker: str | None = None
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``otpmesh stacks PID`` on a plain Python process (no app), optionally with a marker
    file holding `marker` planted for it in `runtime`'s otpmesh directory; assert the process
    was not signalled (SIGUSR2 would have ended it). Returns its pid and the command's result."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    env = dict(os.environ)
    if runtime is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime)
        if marker is not None:
            (runtime / f"otpmesh-{os.getuid()}" / f"app-{sleeper.pid}").write_text(marker)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "otpmesh", "stacks", str(sleeper.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert sleeper.poll() is None  # not signalled
    finally:
        sleeper.kill()
        sleeper.wait()
    return sleeper.pid, out


def test_otpmesh_stacks_refuses_a_process_that_is_not_an_app() -> None:
    pid, out = _stacks_of_a_bystander()
    assert out.returncode == 2
    assert f"process {pid} is not a running otpmesh app" in out.stderr


def test_a_worker_stuck_in_c_holding_the_gil_is_killed_with_its_faulthandler_stacks() -> None:
    # Silent and running for 10 x 0.3 s: hung. Its watchdog thread cannot run (the GIL is
    # held), so the runtime has faulthandler dump its threads (SIGUSR1) before the kill.
    tree = Supervisor("s", children=[Worker("g", Stuck)])

    async def body() -> None:
        async with otpmesh.start(tree, heartbeat_timeout=0.3) as app:
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError):
                await app.actor("s/g").gil_deadlock()
            await app.settled()
            [reason] = _exits(app)
            assert isinstance(reason, otpmesh.Hung), reason
            assert "no heartbeat" in reason.how
            assert "in gil_deadlock" in reason.stacks and "hang_actors.py" in reason.stacks

    run_trio(body, timeout=60)


def test_deadlines_and_stacks_work_through_a_host_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers are forked by a host agent (a real process): the agent reads their watchdog
    # reports, relays stacks requests and the Hung reason of a worker that killed itself.
    monkeypatch.setenv("OTPMESH_SECRET", "test-cluster-secret")
    tree = Mesh("m", Stuck, shape={"hosts": 1, "procs": 2}, progress_deadline=0.5)

    async def body() -> None:
        async with otpmesh.cluster(otpmesh.launchers.Local(hosts=1)), otpmesh.start(tree) as app:
            mesh = app.mesh("m")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mesh.slice(procs=1).steady, 600, 0.05)  # 30 s, progressing
                with trio.fail_after(30):
                    while "endpoint steady" not in (await app.stacks()).actors["m/1"]:
                        await trio.sleep(0.05)
                stacks = await app.stacks()
                assert stacks.actors["m/0"] == "idle"
                assert "at steady (" in stacks.actors["m/1"]
                nursery.cancel_scope.cancel()
            with trio.fail_after(30), pytest.raises(otpmesh.ActorDiedError):
                await mesh.slice(procs=0).spin_forever()
            await app.settled()
            [exit_] = app.events.of_kind(LogKind.CHILD_EXITED)
            hung = exit_.reason  # its process killed itself; the agent relayed why
            assert exit_.child_path == "m/0"
            assert isinstance(hung, otpmesh.Hung) and hung.endpoint == "spin_forever"
            assert "at spin_forever (" in hung.stacks

    run_trio(body, timeout=90)


def test_a_crash_event_carries_the_endpoint_the_traceback_and_the_incarnation() -> None:
    tree = Supervisor("s", children=[Worker("w", Stuck)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            with pytest.raises(otpmesh.ActorError):
                await app.actor("s/w").boom()
            await app.settled()
            [event] = app.events.of_kind(LogKind.CHILD_EXITED)
            crash = event.reason
            assert isinstance(crash, otpmesh.ActorCrash)
            assert (crash.type_name, crash.message, crash.endpoint) == (
                "ValueError",
                "bad input",
                "boom",
            )
            assert 'hang_actors.py", line' in crash.traceback and "in boom" in crash.traceback
            assert event.incarnation == 1

    run_trio(body, timeout=60)


def test_otpmesh_stacks_trusts_no_directory_another_could_have_made(
    tmp_path: Path,
) -> None:
    # A look-alike directory others may write to: a marker planted there must not make
    # otpmesh stacks signal the process it names (SIGUSR2 would end it).
    runtime = tmp_path / "run"
    planted = runtime / f"otpmesh-{os.getuid()}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    _, out = _stacks_of_a_bystander(runtime, marker="")
    assert out.returncode == 2 and "not a private directory of yours" in out.stderr


def test_otpmesh_stacks_refuses_the_stale_marker_of_an_app_whose_pid_was_reused(
    tmp_path: Path,
) -> None:
    # An app SIGKILLed before it could remove its marker, and its pid given to another of your
    # processes: the marker names a process that started at another time, so it is stale.
    runtime = tmp_path / "run"
    (runtime / f"otpmesh-{os.getuid()}").mkdir(parents=True, mode=0o700)
    _, out = _stacks_of_a_bystander(runtime, marker="12345")  # not when it started
    assert out.returncode == 2 and "is not a running otpmesh app" in out.stderr


def test_a_sigstopped_actor_is_killed_at_once_when_its_tree_stops() -> None:
    # Issue 24: stopping waited out the shutdown (and the heartbeat) for a process that cannot
    # run at all. Here both are 60 s, beyond the 30 s guard: only an immediate kill passes.
    tree = Supervisor("s", children=[Worker("z", Stuck, shutdown=60.0), Worker("ok", Stuck)])

    async def body() -> list[object]:
        async with otpmesh.start(tree, heartbeat_timeout=60.0) as app:
            pid = await app.actor("s/z").incarnation_pid()
            os.kill(pid, signal.SIGSTOP)
            with trio.fail_after(10):  # until the kernel says it is stopped
                while _state(pid) not in ("T", "t"):
                    await trio.sleep(0.01)
        return [(e.child_path, e.reason) for e in app.events.of_kind(LogKind.CHILD_TERMINATED)]

    terminated = run_trio(body, timeout=30)
    assert ("s/z", otpmesh._core._reasons.KILLED) in terminated
    assert ("s/ok", "shutdown") in terminated  # the others still stop in order
