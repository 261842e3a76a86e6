"""Let it crash: endpoint exceptions, dead actors, SIGKILLed workers, and no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import trio

import otpmesh
from tests.actors import Echo
from tests.conftest import alive, run_trio, stop_notices


def test_endpoint_exception_crashes_the_actor_and_carries_the_remote_traceback() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(
                otpmesh.ActorError, match="w/1 raised ValueError: bad input"
            ) as info:
                await mesh[1].fail_hard("bad input")  # let_it_crash=True: nothing restarts it
            assert info.value.type_name == "ValueError"
            assert "tests/actors.py" in info.value.traceback
            assert "raise ValueError(message)" in info.value.traceback
            with pytest.raises(
                otpmesh.ActorDiedError, match="w/1 is dead: crashed with ValueError"
            ):
                await mesh[1].echo(1)
            assert await mesh[0].echo(1) == 1  # its sibling lives on

    run_trio(body)


def test_let_it_crash_false_replies_the_error_and_the_actor_lives_on() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(otpmesh.ActorError, match="KeyError"):
                await mesh[0].fail_softly("k")
            assert await mesh[0].echo(2) == 2

    run_trio(body)


def test_unsendable_result_is_an_error_not_a_crash() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            with pytest.raises(
                otpmesh.ActorError, match=r"cannot send a value of type builtins\.object"
            ):
                await mesh[0].unsendable()
            with pytest.raises(otpmesh.EncodeError, match="never pickle"):
                await mesh[0].echo(object())
            assert await mesh[0].echo(2) == 2

    run_trio(body)


def test_sigkill_during_a_call_fails_it_with_the_signal() -> None:
    """Detection is by socket EOF plus the fork server's exit report, so the reason is the signal
    (not a heartbeat timeout: 'hung'); how fast is measured by ``otpmesh bench``
    (restart_ms.after_sigkill_to_next_reply_p50), not asserted on a machine of unknown load."""

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            pid = await mesh[1].pid()

            async def doomed() -> None:
                with pytest.raises(otpmesh.ActorDiedError, match="killed by signal 9") as info:
                    await mesh[1].sleep(30)
                assert f"pid {pid}" in str(info.value)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(doomed)
                await trio.sleep(0.2)
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(otpmesh.ActorDiedError, match="killed by signal 9"):
                await mesh[1].echo(1)
            with pytest.raises(otpmesh.ActorDiedError, match="killed by signal 9"):
                await mesh.echo(1)
            assert await mesh[0].echo(1) == 1

    run_trio(body)


_CONTROLLER = textwrap.dedent(
    """
    import os, sys, trio, otpmesh
    from tests.actors import Echo

    async def main():
        procs = await otpmesh.proc_mesh(procs=2)
        mesh = await procs.spawn("w", Echo)
        print("pids", *(await mesh.pid()).values(), flush=True)
        mode = sys.argv[1]
        if mode == "raise":
            raise RuntimeError("controller failed")
        if mode == "wait":
            await trio.sleep(60)

    if __name__ == "__main__":
        otpmesh.run(main)
    """
)


def _start_controller(tmp_path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:  # type: ignore[no-untyped-def]
    script = tmp_path / "controller.py"
    script.write_text(_CONTROLLER)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("pids"), line + (proc.stderr.read() if proc.stderr else "")
    return proc, [int(p) for p in line.split()[1:]]


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("mode", ["return", "raise"])
def test_workers_exit_when_the_controller_exits(tmp_path, mode: str) -> None:  # type: ignore[no-untyped-def]
    proc, pids = _start_controller(tmp_path, mode)
    proc.wait(timeout=30)
    assert _wait_gone(pids, within=30.0) == []
    if mode == "raise":
        assert proc.returncode != 0


def test_workers_exit_when_the_controller_is_sigkilled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc, pids = _start_controller(tmp_path, "wait")
    assert all(alive(p) for p in pids)
    proc.kill()
    proc.wait(timeout=10)
    assert _wait_gone(pids, within=30.0) == []


def test_ctrl_c_stops_everything_with_one_short_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc, pids = _start_controller(tmp_path, "wait")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    stop_notices(err)
    assert _wait_gone(pids, within=30.0) == []


def test_worker_output_reaches_the_controller_prefixed_with_the_actor_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "shout.py"
    script.write_text(
        textwrap.dedent(
            """
        import otpmesh
        from tests.actors import Echo

        async def main():
            procs = await otpmesh.proc_mesh(procs=2)
            mesh = await procs.spawn("loud", Echo)
            await mesh[1].shout("hello from one")
            await mesh[1].fail_hard("on purpose")

        if __name__ == "__main__":
            otpmesh.run(main)
        """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert "[loud/1] hello from one" in done.stdout
    assert "[loud/1] ValueError: on purpose" in done.stderr
    assert "otpmesh.ActorError" in done.stderr or "ActorError" in done.stderr
