"""``otpmesh watch PID`` against real running programs, and ``otpmesh run file.py:main``."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from rich.console import Console

from otpmesh._cli._cli_watch import Attached, follow, watchable_apps
from otpmesh._cli._display import PlainDisplay, Watch
from otpmesh._cli._screen import render, tree_table
from otpmesh._controller._watch import socket_path, token_path
from otpmesh._wire._secret import NONCE_SIZE

ROOT = Path(__file__).parent.parent

PROGRAM = """\
import os, sys, trio, otpmesh

class Pid(otpmesh.Actor):
    @otpmesh.endpoint
    async def pid(self):
        return os.getpid()

async def main():
    tree = otpmesh.Supervisor("w", intensity=3, period=30, children=[
        otpmesh.Worker("a", Pid), otpmesh.Worker("b", Pid)])
    async with otpmesh.start(tree) as app:
        print(os.getpid(), await app.actor("w/a").pid(), flush=True)
        await trio.sleep(60)

if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.fixture
def program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A running app: (its process, its controller's pid, actor w/a's worker pid).

    It and every watcher a test starts share a runtime directory of their own: apps are
    found there, so "the only app running" is this one, whatever else runs on the machine
    (another xdist worker's apps, another user of the same account)."""
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    script = tmp_path / "watched_program.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert proc.stdout is not None
        controller, worker = map(int, proc.stdout.readline().split())
        yield proc, controller, worker
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def _frame_text(watch: Watch) -> str:
    console = Console(width=120, record=True, file=io.StringIO())
    now = watch.now()
    console.print(render("w", "", watch.view.summary(now), tree_table(watch.view.table(now)), []))
    return console.export_text()


@pytest.mark.timeout(60)
def test_watch_shows_a_restart_of_a_running_program_as_it_happens(
    program: tuple[subprocess.Popen[str], int, int],
) -> None:
    _, controller, worker = program
    lines: list[str] = []
    seen: dict[str, float] = {}

    async def main() -> str:
        attached = await Attached.connect(controller)
        shown: list[Watch] = []
        async with attached.stream, trio.open_nursery() as nursery:
            display = PlainDisplay(lines.append, None)
            nursery.start_soon(follow, attached, None, "w", display, nursery, shown)
            while not lines:  # "started": the backlog is in
                await trio.sleep(0.01)
            assert "w/a" in "\n".join(lines) or shown[0].view["w/a"].state == "running"
            killed = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            while shown[0].view["w/a"].incarnation != 2:
                await trio.sleep(0.01)  # polled: pushed by the app as it happens
            seen["restart shown after (s)"] = time.monotonic() - killed
            text = _frame_text(shown[0])
            nursery.cancel_scope.cancel()
        return text

    text = trio.run(main)
    print(seen)  # measured, not asserted (a loaded machine): well under a second here
    row = next(line for line in text.splitlines() if line.startswith("├── a"))
    assert row.split()[4:7] == ["running", "#2", "1"]
    assert "killed by signal 9 (SIGKILL)" in row
    root = next(line for line in text.splitlines() if line.startswith("w  "))
    assert "1/3 in 30s" in root  # intensity used of its limit
    assert "w running: 2/2 actors running, 1 actor restarts" in text
    assert any("child_exited              w/a #1" in line for line in lines)


@pytest.mark.timeout(60)
def test_watch_command_follows_the_app_until_it_stops_and_prints_stacks(
    program: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, controller, _ = program
    stacks = subprocess.run(
        [sys.executable, "-m", "otpmesh", "watch", str(controller), "--stacks"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert stacks.returncode == 0, stacks.stderr
    assert stacks.stdout.splitlines()[:2] == ["2 actors: w/a, w/b", "  idle"]
    watcher = subprocess.Popen(
        [sys.executable, "-m", "otpmesh", "watch"],  # the only app running
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert watcher.stdout is not None
    assert watcher.stdout.readline().startswith(f"otpmesh watch {controller}: started")
    proc.send_signal(signal.SIGINT)  # the app stops: so does the watch, status 0
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert "supervisor_exited         w  (stopped (shutdown))" in out
    assert out.splitlines()[-3].startswith("w      supervisor one_for_one  stopped")


@pytest.mark.timeout(60)
def test_watch_of_an_app_the_process_does_not_run_says_so_on_one_line_with_status_2(
    program: tuple[subprocess.Popen[str], int, int],
) -> None:
    _, controller, _ = program
    for how in (["--plain"], ["--stacks"]):  # following, or asking once: the same answer
        done = subprocess.run(
            [sys.executable, "-m", "otpmesh", "watch", str(controller), "--app", "nope", *how],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
        )
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        [line] = done.stderr.splitlines()  # no traceback, no exception group
        assert line == "otpmesh watch: no app with root 'nope' runs here (running: w)", line


@pytest.mark.timeout(60)
def test_only_a_holder_of_the_token_is_answered_and_its_files_are_private(
    program: tuple[subprocess.Popen[str], int, int],
) -> None:
    _, controller, _ = program
    directory = watchable_apps()[controller]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(token_path(directory, controller).stat().st_mode) == 0o600
    assert "secret" not in json.loads(token_path(directory, controller).read_text())
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(socket_path(directory, controller)))
        assert len(s.recv(NONCE_SIZE)) == NONCE_SIZE
        s.sendall(os.urandom(64) + b'{"op": "watch", "app": null}\n')  # a wrong proof
        try:
            answer = s.recv(1 << 16)
        except ConnectionResetError:  # closed with our bytes unread
            answer = b""
        assert answer == b""  # closed: not a byte of the app


DRIVER = """\
import os, signal, otpmesh

class Pid(otpmesh.Actor):
    @otpmesh.endpoint
    async def pid(self):
        return os.getpid()

async def main():
    tree = otpmesh.Supervisor("d", children=[otpmesh.Worker("a", Pid)])
    async with otpmesh.start(tree) as app:
        pid = await app.actor("d/a").pid()
        os.kill(pid, signal.SIGKILL)
        print("driver restarted", await otpmesh.retry(app.actor("d/a").pid) != pid)
"""


@pytest.mark.timeout(60)
def test_run_a_driver_shows_the_tree_it_starts(tmp_path: Path) -> None:
    job = tmp_path / "driver_job.py"
    job.write_text(DRIVER)
    cli = [sys.executable, "-m", "otpmesh", "run"]
    done = subprocess.run(
        [*cli, f"{job}:main"], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"otpmesh run {job}:main (d): started")
    assert "driver restarted True" in out
    assert "child_exited              d/a #1  (its process" in out
    assert out.splitlines()[-1].split()[:6] == ["└──", "a", "worker", "Pid", "stopped", "#2"]
    refused = subprocess.run(
        [*cli, f"{job}:main", "--local"], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert refused.returncode == 2
    assert "--local: for a TREE" in refused.stderr


OWNER_PROGRAM = """\
import os, sys, trio, otpmesh
from tests.router_actors import Router

async def main():
    tree = otpmesh.Supervisor("svc", children=[otpmesh.Worker("router", Router)])
    async with otpmesh.start(tree) as app:
        await app.actor("svc/router").pids()
        print(os.getpid(), flush=True)
        await trio.sleep(60)

if __name__ == "__main__":
    otpmesh.run(main)
"""


@pytest.mark.timeout(60)
def test_a_late_watcher_sees_an_owned_subtree_with_its_strategy_and_intensity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, an owned subtree showed as bare children: no strategy, no intensity."""
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    script = tmp_path / "owner_program.py"
    script.write_text(OWNER_PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        controller = int(proc.stdout.readline())

        async def main() -> str:
            attached = await Attached.connect(controller)
            shown: list[Watch] = []
            lines: list[str] = []
            async with attached.stream, trio.open_nursery() as nursery:
                display = PlainDisplay(lines.append, None)
                nursery.start_soon(follow, attached, None, "svc", display, nursery, shown)
                while not lines:  # the backlog is in (it started before this watcher)
                    await trio.sleep(0.01)
                text = _frame_text(shown[0])
                nursery.cancel_scope.cancel()
            return text

        text = trio.run(main)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    engines = next(line for line in text.splitlines() if "engines" in line)
    assert "procs=3 one_for_one" in engines and "0/10 in 5s" in engines, text
    assert sum("running" in line for line in text.splitlines()) >= 4  # router + 3 engines
