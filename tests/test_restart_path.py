"""The path of a restart after a SIGKILL (docs/architecture.md, "How a restart flows").

A SIGKILLed worker's slot is refilled by the spare its fork server started ahead
(_runtime/_spare.py): the new incarnation runs in that process, with its own slot's environment
and output; a spare started for other settings is retired, never handed out. A death is known
from the dead worker's own exit status even while its fork server cannot report it. Every worker
is in a session (so a scheduling group) of its own, not its siblings'. How fast each step is,
``python -m otpmesh.bench`` and ``python -m otpmesh.bench rl`` measure; no test times it."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import trio

import otpmesh
from otpmesh._node._node import current_node
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._runtime._worker import WARMUP_PATH
from tests.conftest import alive, run_trio


class Probe(otpmesh.Actor):
    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @otpmesh.endpoint
    def sys_path(self) -> list[str]:
        return list(sys.path)

    @otpmesh.endpoint
    def shout(self, text: str) -> None:
        print(text, flush=True)

    @otpmesh.endpoint
    def warm_state(self) -> dict[str, Any]:
        """Whether this process ran a spare's warm-up, and what it left behind."""
        node = current_node()
        assert node is not None
        return {
            "warmed": "otpmesh._runtime._warmup" in sys.modules,
            "answered": getattr(sys.modules.get("otpmesh._runtime._warmup"), "answered", 0),
            "actors": sorted(node.actors),
            "left": [WARMUP_PATH in node.exited, WARMUP_PATH in node.last_exit],
        }


def _children(ppid: int) -> set[int]:
    """The live (not zombie) children of `ppid`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid and fields[0] != "Z":
                found.add(int(entry))
    return found


async def _spare(workers: set[int]) -> int:
    """The fork server's one child that is none of `workers`: its spare, once it is forked."""
    server = (await runtime()).forkserver.pid
    assert server is not None
    while True:
        others = _children(server) - workers
        if others:
            assert len(others) == 1, f"one spare at most, not {sorted(others)}"
            return others.pop()
        await trio.sleep(0.01)


async def _new_pid(ref: Any, old: int) -> int:
    """`ref`'s pid once its next incarnation answers (calls during the restart may fail)."""
    while True:
        try:
            pid: int = await ref.pid()
        except otpmesh.ActorDiedError:
            pid = old
        if pid != old:
            return pid
        await trio.sleep(0.01)


def test_a_sigkilled_workers_slot_is_refilled_by_the_spare_forked_before_the_kill(
    capsys: Any,
) -> None:
    tree = otpmesh.Supervisor(
        "s", children=[otpmesh.Mesh("m", Probe, shape={"procs": 2}, intensity=5)]
    )

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/m")
            pids = (await mesh.pid()).values()
            spare = await _spare(set(pids))
            os.kill(pids[1], signal.SIGKILL)
            new = await _new_pid(mesh[1], pids[1])
            assert new == spare  # forked before the kill: the restart did not fork
            assert await mesh[1].env("OTPMESH_RANK") == "1"  # its slot's, given with it
            assert await mesh[0].env("OTPMESH_RANK") == "0"
            await mesh[1].shout("from the spare")
            # The next spare is forked for the next restart, and it is not the new worker.
            assert await _spare({pids[0], new}) not in (pids[0], new)

    run_trio(body)
    assert "[s/m/1] from the spare" in capsys.readouterr().out


def test_a_spare_warms_the_restart_path_up_before_its_process_and_keeps_nothing_of_it() -> None:
    """A spare starts, calls and stops an actor of otpmesh's own while it waits (its first
    writes to the fork server's pages are paid then, not by the restart), and the process it
    is handed shows nothing of it. A worker forked for a start is not warmed (nobody waits)."""
    tree = otpmesh.Supervisor("s", intensity=5, children=[otpmesh.Worker("w", Probe)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref = app.actor("s/w")
            first = await ref.pid()
            assert (await ref.warm_state())["warmed"] is False
            spare = await _spare({first})
            os.kill(first, signal.SIGKILL)
            assert await _new_pid(ref, first) == spare
            state = await ref.warm_state()
            assert state == {
                "warmed": True,
                "answered": 2,  # it started, and both calls came back
                "actors": ["s/w"],
                "left": [False, False],
            }

    run_trio(body)


def test_a_spare_has_proven_itself_to_the_controller_before_it_is_handed_a_process() -> None:
    """A spare dials and authenticates while it waits, so a restart that takes it only sends
    its HELLO: the controller holds a proven connection from the spare's pid before the kill,
    and that connection is the one the new incarnation registers on."""
    tree = otpmesh.Supervisor("s", intensity=5, children=[otpmesh.Worker("w", Probe)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            rt = await runtime()
            ref = app.actor("s/w")
            pid = await ref.pid()
            spare = await _spare({pid})
            with trio.fail_after(30):
                while rt.node.proven.get(f"pid {spare}", 0) < 1:
                    await trio.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            assert await _new_pid(ref, pid) == spare
            assert rt.node.proven[f"pid {spare}"] == 1  # no second dial: the early one serves

    run_trio(body)


def test_a_spare_started_for_other_settings_is_retired_not_handed_out(tmp_path: Any) -> None:
    tree = otpmesh.Supervisor("s", intensity=5, children=[otpmesh.Worker("w", Probe)])
    extra = str(tmp_path)

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref = app.actor("s/w")
            pid = await ref.pid()
            spare = await _spare({pid})
            sys.path.append(extra)  # a worker started now is started with it: not the spare
            try:
                os.kill(pid, signal.SIGKILL)
                new = await _new_pid(ref, pid)
                assert new != spare
                assert extra in await ref.sys_path()
                with trio.fail_after(10):
                    while alive(spare):
                        await trio.sleep(0.01)
                assert await _spare({new}) != spare  # the next one, with the new settings
            finally:
                sys.path.remove(extra)
        # The tree stopped: nothing of it will restart, so no spare is kept either.
        server = (await runtime()).forkserver.pid
        assert server is not None
        with trio.fail_after(10):
            while _children(server):
                await trio.sleep(0.01)

    run_trio(body)


def test_a_death_is_known_from_its_exit_status_while_its_fork_server_cannot_report_it() -> None:
    """The controller does not wait for the fork server's report when the dead worker, still
    unreaped, says its own exit status: with the server stopped, the exit is the signal (and not
    'lost its connection', which is all that is known once waiting for the report ran out)."""
    tree = otpmesh.Supervisor("s", intensity=5, children=[otpmesh.Worker("w", Probe)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref = app.actor("s/w")
            pid = await ref.pid()
            server = (await runtime()).forkserver.pid
            assert server is not None
            os.kill(server, signal.SIGSTOP)
            try:
                os.kill(pid, signal.SIGKILL)
                with trio.fail_after(20):
                    while not app.events.of_kind("child_exited"):
                        await trio.sleep(0.01)
                (exit_,) = app.events.of_kind("child_exited")
                assert "killed by signal 9 (SIGKILL)" in str(exit_.reason)
            finally:
                os.kill(server, signal.SIGCONT)
            assert await _new_pid(ref, pid) != pid  # and the restart goes on once it runs

    run_trio(body)


def test_every_worker_is_in_a_session_of_its_own_so_busy_siblings_share_no_cpu_with_it() -> None:
    """Linux shares CPU between sessions' scheduling groups (autogroups) before the processes
    in them: in one session, a restarting worker beside busy siblings got a sliver of their
    one share (issue 26: a rollout's restart 3x the learner's, whose siblings were idle)."""
    tree = otpmesh.Supervisor(
        "s", children=[otpmesh.Mesh("m", Probe, shape={"procs": 2}, intensity=5)]
    )

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            pids = (await app.mesh("s/m").pid()).values()
            assert [os.getsid(pid) for pid in pids] == pids
            spare = await _spare(set(pids))
            assert os.getsid(spare) == spare

    run_trio(body)
