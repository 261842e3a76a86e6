"""A worker's death heard from its death lock (_runtime/_deathlock.py), wired into the runtime.

Every worker the fork server forks holds a robust lock in a page of its own; the controller
watches it and hears of an exit when the kernel releases it, before the dead process's memory is
torn down and its socket closes. To show that the lock, and nothing else, noticed a death, the
other two ways are shut off first: the worker's sockets are kept open by a process it started
(so no end of stream comes), and its fork server is stopped (so no exit report comes) until the
death was reported. Real processes, real SIGKILL; nothing is timed."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import LogKind, Mesh, Supervisor, Worker
from otpmesh._runtime import _deathlock
from otpmesh._runtime._controller_runtime import Runtime, runtime
from otpmesh._runtime._deaths import Deaths
from otpmesh._runtime._liveness import NOT_EXITING, dying_status, proc_state
from otpmesh._runtime._proc import Proc
from tests.actors import Member
from tests.conftest import alive, run_trio
from tests.test_restart_path import _new_pid

pytestmark = pytest.mark.skipif(not _deathlock.available(), reason="no robust futex wait here")


class Mortal(Member):  # Member's keep and call_kept: a ref held by another actor
    @otpmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @otpmesh.endpoint
    def keep_sockets_open(self) -> int:
        """Start a process that holds every socket of this one: its death closes none."""
        socks = []
        for fd in range(3, 1024):
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    socks.append(fd)
            except OSError:
                pass
        keeper = subprocess.Popen(["sleep", "600"], pass_fds=socks, start_new_session=True)
        return keeper.pid

    @otpmesh.endpoint
    def exit_with(self, code: int) -> None:
        os._exit(code)

    @otpmesh.endpoint
    def words_when(self, flag: str, words: str) -> str:
        """`words` once file `flag` exists (this process's loop held till then: the next
        message waits in its socket)."""
        while not os.path.exists(flag):
            time.sleep(0.005)
        return words

    @otpmesh.endpoint
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @otpmesh.endpoint
    def forge(self) -> None:
        """Write "its owner died" into this process's own lock word, and wake the watcher."""
        word = ctypes.c_uint32.from_buffer(_deathlock._held[0])
        word.value |= _deathlock._FUTEX_OWNER_DIED
        _deathlock._libc.syscall(_deathlock._SYS_FUTEX, ctypes.byref(word), 1, 1, None, None, 0)


def _unread(sock: socket.socket) -> int:
    """Bytes waiting in `sock`'s receive queue."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)))[0])


def _proc(rt: Runtime, pid: int) -> Proc:
    return next(p for p in rt.procs.values() if p.pid == pid)


def _exits(app: otpmesh.App, path: str) -> list[Any]:
    return [e for e in app.events.of_kind(LogKind.CHILD_EXITED) if e.child_path == path]


async def _reported(app: otpmesh.App, path: str, count: int) -> Any:
    """The `count`-th exit of `path` reported to its supervisor, once it is."""
    while len(_exits(app, path)) < count:
        await trio.sleep(0.005)
    return _exits(app, path)[count - 1]


@asynccontextmanager
async def _only_its_lock_can_tell(rt: Runtime, ref: Any) -> AsyncIterator[None]:
    """No end of stream (a keeper holds the worker's sockets) and no fork server report (it is
    stopped) while inside; both come back after."""
    keeper = await ref.keep_sockets_open()
    server = rt.forkserver.pid
    assert server is not None
    os.kill(server, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server, signal.SIGCONT)
        os.kill(keeper, signal.SIGKILL)


async def _reaped(rt: Runtime, pid: int) -> None:
    """Until the fork server reported `pid`'s exit (the later report of a death)."""
    while pid in rt._by_pid or alive(pid):
        await trio.sleep(0.01)


@asynccontextmanager
async def _lone_worker() -> AsyncIterator[tuple[otpmesh.App, Any, Runtime, int]]:
    """An app of one Mortal worker ("s/w"), settled: the app, its ref, the runtime, its pid."""
    tree = Supervisor("s", intensity=5, children=[Worker("w", Mortal)])
    async with otpmesh.start(tree) as app:
        ref, rt = app.actor("s/w"), await runtime()
        pid = await ref.pid()
        await app.settled()
        yield app, ref, rt, pid


def _died_alone(how: str, expected: str) -> None:
    async def body() -> None:
        async with _lone_worker() as (app, ref, rt, pid):
            async with _only_its_lock_can_tell(rt, ref):
                if how == "sigkill":
                    os.kill(pid, signal.SIGKILL)
                else:
                    with pytest.raises(otpmesh.ActorDiedError):
                        await ref.exit_with(3)
                exit = await _reported(app, "s/w", 1)
            assert _proc(rt, pid).noticed_by == "deathlock"
            assert expected in str(exit.reason), exit.reason
            assert await _new_pid(ref, pid) != pid  # restarted
            await _reaped(rt, pid)
            await app.settled()
            assert len(_exits(app, "s/w")) == 1  # its reaping reported nothing more

    run_trio(body)


def test_a_sigkilled_worker_is_heard_from_its_lock_and_reported_once() -> None:
    _died_alone("sigkill", "killed by signal 9 (SIGKILL)")


def test_a_worker_that_exits_by_itself_is_reported_once_with_its_exit_code() -> None:
    _died_alone("exit", "exited with code 3")


@pytest.mark.parametrize("code", [5, 0])
def test_a_lock_heard_after_the_process_was_reaped_reports_its_own_exit_code(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """The lock's wake reaches the loop after the fork server reaped the process and before its
    report is read (a loaded machine: the wake is queued behind other work): /proc no longer
    knows the process, and its status must come from the report, not be taken for a SIGKILL
    (CI saw an ``os._exit(5)`` reported as "killed by signal 9"). Here that order is made: the
    lock's wake is held back and delivered just before the fork server's report is handled,
    and a keeper holds the worker's sockets (no end of stream)."""
    heard: list[Proc] = []
    reaped = Deaths.reaped

    def report_after_the_lock(self: Deaths, proc: Proc, reason: str) -> None:
        assert not alive(proc.pid)  # reaped already
        if proc in heard:
            self.dying(proc)
        reaped(self, proc, reason)

    monkeypatch.setattr(Deaths, "_heard", lambda self, proc: heard.append(proc))
    monkeypatch.setattr(Deaths, "reaped", report_after_the_lock)

    async def body() -> None:
        async with _lone_worker() as (app, ref, rt, pid):
            keeper = await ref.keep_sockets_open()
            try:
                with pytest.raises(otpmesh.ActorDiedError):
                    await ref.exit_with(code)
                exit = await _reported(app, "s/w", 1)
            finally:
                os.kill(keeper, signal.SIGKILL)
            assert [p.pid for p in heard] == [pid]
            assert _proc(rt, pid).noticed_by == "deathlock"
            assert f"exited with code {code}" in str(exit.reason), exit.reason
            assert await _new_pid(ref, pid) != pid
            await app.settled()
            assert len(_exits(app, "s/w")) == 1

    run_trio(body)


def test_the_kernel_tells_an_exiting_process_from_a_forger_and_a_reaped_one() -> None:
    """``dying_status`` on real children of this process: alive and not exiting (what a forged
    lock word looks like), exited (a zombie: exiting, its status readable), and reaped."""
    me = os.getpid()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert dying_status(sleeper.pid, me) == NOT_EXITING
        assert dying_status(sleeper.pid, me + 1) is None  # not that parent's child
    finally:
        sleeper.kill()
        sleeper.wait()
    for code, status in [(5, 5 << 8), (0, None)]:
        child = subprocess.Popen([sys.executable, "-c", f"import os; os._exit({code})"])
        while proc_state(child.pid) != "Z":
            time.sleep(0.005)
        assert dying_status(child.pid, me) == status  # 0 reads as "not known here"
        child.wait()
        assert dying_status(child.pid, me) is None  # reaped: its report says it
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()
    while proc_state(killed.pid) != "Z":
        time.sleep(0.005)
    assert dying_status(killed.pid, me) == signal.SIGKILL
    killed.wait()


def test_a_peer_calls_the_new_incarnation_while_the_dead_ones_sockets_are_open() -> None:
    """The death is reported while the dead process's sockets are still open (a keeper holds
    them here; in life, while the kernel tears a large process down): another actor's call to
    it after the report must go to its new incarnation, not into the old socket, where it would
    wait for a reply that never comes."""
    tree = Supervisor("s", intensity=5, children=[Worker("t", Mortal), Worker("c", Mortal)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            target, caller, rt = app.actor("s/t"), app.actor("s/c"), await runtime()
            await caller.keep(target)
            first = await caller.call_kept("pid")  # the caller's connection to it is open
            await app.settled()
            keeper = await target.keep_sockets_open()
            try:
                server = rt.forkserver.pid
                assert server is not None
                os.kill(server, signal.SIGSTOP)  # its report cannot come first
                try:
                    os.kill(first, signal.SIGKILL)
                    await _reported(app, "s/t", 1)
                finally:
                    os.kill(server, signal.SIGCONT)
                assert _proc(rt, first).noticed_by == "deathlock"
                with trio.fail_after(20):
                    second = await caller.call_kept("pid")
            finally:
                os.kill(keeper, signal.SIGKILL)
            assert second != first and second == await target.pid()
            assert _exits(app, "s/c") == []

    run_trio(body)


def test_the_reply_a_worker_sent_just_before_it_died_reaches_its_caller(tmp_path: Any) -> None:
    """The reply and the death arrive while the controller's loop is held, so the lock's news
    and the reply are both waiting when it runs again, in either order: the reply must win
    (the connection is read to its end before the pending calls fail)."""
    tree = Supervisor("s", intensity=20, children=[Worker("w", Mortal)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref, rt = app.actor("s/w"), await runtime()
            for round in range(6):
                pid = await _new_pid(ref, -1)
                await app.settled()
                conn = _proc(rt, pid).conn
                assert conn is not None
                flag = tmp_path / f"go{round}"
                got: list[str] = []

                async def ask() -> None:
                    got.append(await ref.words_when(str(flag), f"last words {round}"))  # noqa: B023

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask)
                    while not conn.pending:  # its call is sent
                        await trio.sleep(0)
                    await ref.die.broadcast()
                    while conn._out or conn._writing:  # and the order to die after it
                        await trio.sleep(0)
                    # Hold this loop: the worker answers, then dies, meanwhile.
                    flag.touch()
                    deadline = time.monotonic() + 30
                    while alive(pid) and time.monotonic() < deadline:
                        time.sleep(0.002)
                    assert _unread(conn.sock) > 0  # its reply is waiting, not read yet
                assert got == [f"last words {round}"]
                assert await _new_pid(ref, pid) != pid

    run_trio(body, timeout=120)


def test_a_worker_that_forges_its_word_is_killed_and_restarted_its_siblings_untouched() -> None:
    tree = Supervisor("s", children=[Mesh("m", Mortal, shape={"procs": 2})])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh, rt = app.mesh("s/m"), await runtime()
            forger, sibling = await mesh[0].pid(), await mesh[1].pid()
            await app.settled()
            try:
                await mesh[0].forge()
            except otpmesh.ActorDiedError:
                pass  # killed before its reply went
            exit = await _reported(app, "s/m/0", 1)
            assert "SIGKILL" in str(exit.reason)
            assert _proc(rt, forger).noticed_by == "deathlock"
            await _reaped(rt, forger)  # dead for real
            assert await _new_pid(mesh[0], forger) != forger
            assert await mesh[1].pid() == sibling
            assert _exits(app, "s/m/1") == []

    run_trio(body)


def test_a_clean_stop_reports_no_death_and_leaves_no_watcher_thread() -> None:
    tree = Supervisor("s", children=[Mesh("m", Mortal, shape={"procs": 2})])
    procs: list[Proc] = []

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            rt = await runtime()
            await app.mesh("s/m").pid()
            assert rt.deaths.watch.threads() == 1
            procs.extend(rt.procs.values())
        for proc in procs:
            await proc.exited.wait()
        assert all(e.reason == "shutdown" for e in app.events.of_kind(LogKind.CHILD_EXITED))

    run_trio(body)
    assert all(p.noticed_by != "deathlock" for p in procs)
    assert not [t for t in threading.enumerate() if t.name == "otpmesh-deathwatch"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
