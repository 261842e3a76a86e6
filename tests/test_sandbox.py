"""A compromised actor cannot end or freeze its app with a signal (docs/security.md): each
worker is a Landlock domain of its own (``otpmesh/_core/_sandbox.py``), so its SIGKILL and
SIGSTOP to the controller, the fork server and a sibling worker in another mesh are refused
with EPERM, with ``CAP_KILL`` or without, and every target carries on. ``OTPMESH_SANDBOX=0``
turns it off; a kernel without the scope is said once at start.

The apps run in processes of their own (``tests/sandbox_actors.py``): a signal let through
ends that app, not the test run, and an app can run with capabilities dropped."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh._core import _sandbox
from otpmesh._wire._unproven import parent_pid
from tests.actors import Echo
from tests.conftest import run_trio
from tests.sandbox_actors import Attacker

ROOT = Path(__file__).resolve().parent.parent
REFUSED = {"kill": "EPERM", "pidfd": "EPERM"}

needs_scope = pytest.mark.skipif(
    _sandbox.unavailable() is not None, reason=f"no signal scoping: {_sandbox.unavailable()}"
)


def _attack(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.sandbox_actors", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # a signal to the app's process group is not this run's
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def _no_new_privs() -> bool:
    with open("/proc/self/status") as f:
        return any(line.split() == ["NoNewPrivs:", "1"] for line in f)


def _assert_refused_and_unharmed(result: dict[str, Any]) -> None:
    assert result["sent"] == {
        f"{target} {name}": REFUSED
        for target in ("controller", "fork server", "sibling")
        for name in ("SIGCONT", "SIGSTOP", "SIGKILL")
    }
    for target, letter in result["states"].items():
        assert letter in ("R", "S", "D"), (target, letter)  # not stopped (T), not gone
    assert result["sibling answers"] and result["fork server forks"]
    # What it may still signal: itself, and what it forks.
    assert result["own"] == {"self": "sent", "own child": "sent"}


@needs_scope
@pytest.mark.timeout(150)
def test_an_actor_with_cap_kill_cannot_sigkill_or_sigstop_its_app() -> None:
    # Its app: the controller, the fork server and a sibling worker in another mesh.
    if os.getuid() != 0:
        pytest.skip("needs root: only root's processes have CAP_KILL")
    result = _attack()
    assert result["attacker"]["caps"]["cap_kill"], result["attacker"]  # Landlock refuses anyway
    # A worker with CAP_SYS_ADMIN enters its domain without no_new_privs (setuid helpers work).
    attacker = result["attacker"]
    assert attacker["no_new_privs"] is not attacker["caps"]["cap_sys_admin"], attacker
    _assert_refused_and_unharmed(result)


@needs_scope
@pytest.mark.timeout(150)
def test_an_actor_without_capabilities_cannot_sigkill_or_sigstop_its_app() -> None:
    # As any user without CAP_KILL (root: dropped for the whole app, fork server included).
    result = _attack("--drop", "cap_kill", "cap_sys_admin")
    assert result["attacker"]["caps"] == {"cap_kill": False, "cap_sys_admin": False}
    # Without CAP_SYS_ADMIN a worker sets no_new_privs to enter its domain.
    assert result["attacker"]["no_new_privs"] is True
    _assert_refused_and_unharmed(result)


@pytest.mark.timeout(150)
def test_otpmesh_sandbox_0_leaves_workers_free_to_signal_the_app() -> None:
    # SIGCONT alone: harmless to a running process, and let through as a SIGKILL would be.
    result = _attack("--signals", "SIGCONT", env={_sandbox.ENV: "0"})
    assert result["sent"] == {
        f"{target} SIGCONT": {"kill": "sent", "pidfd": "sent"}
        for target in ("controller", "fork server", "sibling")
    }
    assert result["attacker"]["no_new_privs"] is _no_new_privs()  # as this process: untouched
    assert result["sibling answers"] and result["fork server forks"]


@needs_scope
def test_a_kernel_that_scopes_signals_needs_no_word_and_the_setting_reads_as_documented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_sandbox.ENV, raising=False)
    assert _sandbox.abi() >= _sandbox.SCOPE_ABI and _sandbox.wanted()
    assert _sandbox.warning() is None
    monkeypatch.setenv(_sandbox.ENV, "0")
    assert not _sandbox.wanted()
    monkeypatch.setenv(_sandbox.ENV, "1")
    assert _sandbox.wanted()
    assert not _sandbox.confined()  # the test run itself is nobody's worker


@pytest.mark.timeout(120)
def test_a_kernel_without_signal_scoping_is_said_once_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The controller asks its own kernel (the workers' fork server asks again for itself):
    # this controller is told its kernel has Landlock ABI 5 (Linux 6.10), without scopes.
    monkeypatch.setattr(_sandbox, "abi", lambda: 5)
    monkeypatch.setattr(_sandbox, "_warned", False)
    monkeypatch.delenv(_sandbox.ENV, raising=False)
    caplog.set_level(logging.WARNING, logger="otpmesh.forkserver")

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = (await procs.spawn("echo", Echo))[0]
            assert await echo.echo(1) == 1

    for _ in range(2):  # two apps in this process, each with its fork server: said once
        run_trio(body, timeout=60)
    said = [r.getMessage() for r in caplog.records if r.name == "otpmesh.forkserver"]
    assert len(said) == 1, said
    assert "workers are not sandboxed: this kernel's Landlock is ABI 5" in said[0]
    assert "SIGKILL or SIGSTOP its controller, fork server, sibling workers" in said[0]

    caplog.clear()
    monkeypatch.setattr(_sandbox, "_warned", False)
    monkeypatch.setenv(_sandbox.ENV, "0")  # asked for: nothing to say
    assert _sandbox.warning_once() is None


@needs_scope
@pytest.mark.timeout(120)
def test_a_spare_started_in_a_sandbox_is_not_given_a_mesh_that_turned_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A spare enters its sandbox (or not) before it knows its mesh: a mesh spawned under
    # another setting gets a fresh fork, whose actor may signal the app (here SIGCONT, harmless).
    monkeypatch.delenv(_sandbox.ENV, raising=False)
    tree = otpmesh.Supervisor("s", children=[otpmesh.Mesh("m", Attacker, shape={"procs": 1})])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            attacker = app.mesh("s/m")[0]
            assert await attacker.send(os.getpid(), "SIGCONT") == REFUSED
            me = await attacker.whoami()
            spare = await _spare(me["ppid"], {me["pid"]})  # forked for the tree's restarts
            monkeypatch.setenv(_sandbox.ENV, "0")  # the next mesh's setting
            later = await otpmesh.proc_mesh(procs=1)
            free = (await later.spawn("free", Attacker))[0]
            assert (await free.whoami())["pid"] != spare
            assert await free.send(os.getpid(), "SIGCONT") == {"kill": "sent", "pidfd": "sent"}

    run_trio(body, timeout=90)


async def _spare(server: int, workers: set[int]) -> int:
    """The fork server's one child that is none of `workers`: its spare, once forked."""
    while True:
        children = {
            int(entry)
            for entry in os.listdir("/proc")
            if entry.isdigit() and parent_pid(int(entry)) == server
        }
        if children - workers:
            return (children - workers).pop()
        await trio.sleep(0.01)
