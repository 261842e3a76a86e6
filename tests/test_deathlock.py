"""The death lock (otpmesh/_runtime/_deathlock.py): real processes, real SIGKILLs, no mocks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from otpmesh._runtime import _deathlock
from otpmesh._runtime._deathlock import DeathWatch, new_page

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not _deathlock.available(), reason="no futex_waitv/memfd/robust mutex"),
]

# The worker's side: take the lock, say so, then wait (or forge its word, or exit normally).
_HOLDER = """
import ctypes, mmap, os, sys, time
from otpmesh._runtime import _deathlock
fd = int(sys.argv[1])
if sys.argv[2] == "forge":
    page = mmap.mmap(os.dup(fd), 4096, mmap.MAP_SHARED)
_deathlock.hold(fd)
print("held", flush=True)
sys.stdin.readline()
if sys.argv[2] == "forge":  # write OWNER_DIED into its own word and wake the waiter
    word = ctypes.c_uint32.from_buffer(page)
    word.value = 0x40000000
    _deathlock._libc.syscall(_deathlock._SYS_FUTEX, ctypes.byref(word), 1, 1, None, None, 0)
    time.sleep(60)
os._exit(0)
"""


@contextlib.contextmanager
def _holding(mode: str = "hold") -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A holder process and its page's fd, both ended afterwards."""
    proc, fd = _holder(mode)
    try:
        yield proc, fd
    finally:
        proc.kill()
        proc.communicate()
        os.close(fd)


def _holder(mode: str = "hold") -> tuple[subprocess.Popen[str], int]:
    fd = new_page()
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(fd), mode],
        pass_fds=(fd,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc, fd


class _Heard:
    def __init__(self) -> None:
        self.keys: list[object] = []
        self.event = threading.Event()

    def __call__(self, key: object) -> None:
        self.keys.append(key)
        self.event.set()


@pytest.fixture
def watch() -> Iterator[DeathWatch]:
    """A DeathWatch, stopped afterwards with no thread left."""
    w = DeathWatch()
    try:
        yield w
    finally:
        w.stop()
    assert w.threads() == 0


def _tell(proc: subprocess.Popen[str]) -> None:
    """Let a holder go on (forge its word, or exit normally)."""
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


def test_a_sigkilled_holder_is_heard_through_its_lock_before_it_is_reaped(
    watch: DeathWatch,
) -> None:
    heard = _Heard()
    with _holding() as (proc, fd):
        assert watch.watch(fd, "w1", heard)
        proc.kill()
        assert heard.event.wait(30)
        assert heard.keys == ["w1"]


def test_a_holder_that_forges_its_word_reports_itself_never_a_sibling(watch: DeathWatch) -> None:
    heard = _Heard()
    with _holding("forge") as (forger, ffd), _holding() as (sibling, sfd):
        assert watch.watch(ffd, "forger", heard)
        assert watch.watch(sfd, "sibling", heard)
        _tell(forger)
        assert heard.event.wait(30)
        assert heard.keys == ["forger"]
        assert sibling.poll() is None
        heard.event.clear()
        sibling.send_signal(signal.SIGKILL)
        assert heard.event.wait(30)
        assert heard.keys == ["forger", "sibling"]


def test_a_normal_exit_also_releases_the_lock(watch: DeathWatch) -> None:
    heard = _Heard()
    with _holding() as (proc, fd):
        assert watch.watch(fd, "w", heard)
        _tell(proc)
        assert proc.wait(30) == 0
        assert heard.event.wait(30)
        assert heard.keys == ["w"]


def test_a_stopped_watch_takes_no_more_and_leaves_no_thread_or_fd() -> None:
    before = set(os.listdir("/proc/self/fd"))
    watch = DeathWatch()
    proc, fd = _holder()
    try:
        assert watch.watch(fd, "w", _Heard())
        assert watch.threads() == 1
    finally:
        watch.stop()
        proc.kill()
        proc.communicate()
        os.close(fd)
    assert watch.threads() == 0
    assert not any(t.name == "otpmesh-deathwatch" for t in threading.enumerate())
    late = new_page()
    try:
        assert not watch.watch(late, "late", _Heard())
    finally:
        os.close(late)
    assert set(os.listdir("/proc/self/fd")) <= before
