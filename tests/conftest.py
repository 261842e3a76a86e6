"""Shared test helpers: run a trio body with a deadline, and actors the tests spawn.

Worker processes are real (fork server, Unix sockets, signals); nothing here mocks them.
"""

from __future__ import annotations

import fcntl
import gc
import os
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

# Workers of most tests never touch a tensor: don't make every fork server import torch.
os.environ.setdefault("OTPMESH_PRELOAD", "")

# A suite started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# ignored, and so would every program a test starts: an ignored signal stays ignored across
# exec, and Python then installs no Ctrl-C handler. The tests that stop a program with SIGINT
# need it delivered: a handled signal (this) is reset to the default in a child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: How much slower than the machines the deadlines were set on this one is measured to be: the
#: soft-RoCE guest emulates its CPUs, and on a busy host a fresh interpreter there takes minutes
#: to import torch (tests/rdma/run_softroce.sh measures it and sets this). Every deadline of a
#: test (run_trio's, pytest-timeout's) is multiplied by it, so that a slow machine makes the run
#: long, never wrong; 1 elsewhere.
SLOWDOWN = max(1.0, float(os.environ.get("OTPMESH_TEST_SLOWDOWN") or 1))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SLOWDOWN == 1.0:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = float(marker.args[0]) if marker and marker.args else default
        if base > 0:  # the closest marker wins: this one, put first
            item.add_marker(pytest.mark.timeout(base * SLOWDOWN), append=False)


# ---------------------------------------------------------------- the whole machine, under xdist

WHOLE_MACHINE = "whole_machine"


def _lock(path: str, how: int) -> int:
    """`path` locked `how`, released when the descriptor closes. A POSIX record lock (lockf),
    not flock: it belongs to this process alone, so a child a test forks (and that outlives
    the test) does not go on holding it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.lockf(fd, how)
    return fd


_LOCKS = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The xdist controller, once per worker: every worker of this run locks files in one
    directory of its own (made here, removed when the session ends)."""
    config = node.config
    if _LOCKS not in config.stash:
        config.stash[_LOCKS] = tempfile.mkdtemp(prefix="otpmesh-tests-")
    node.workerinput["otpmesh_locks"] = config.stash[_LOCKS]


def pytest_sessionfinish(session: pytest.Session) -> None:
    locks = session.config.stash.get(_LOCKS, None)
    if locks is not None:
        shutil.rmtree(locks, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Under pytest-xdist, a test marked ``whole_machine`` runs while no other worker runs any
    test; the others run side by side. A readers-writer lock shared by this run's workers:
    every test holds it shared, a marked one exclusive. The turnstile (taken briefly by every
    test, and held by a marked one while it waits) keeps a stream of unmarked tests from
    starving it. Outermost (tryfirst), so that the wait counts against no test's timeout and
    the lock is held through setup and teardown."""
    locks = getattr(item.config, "workerinput", {}).get("otpmesh_locks")
    if locks is None:  # not an xdist worker: tests run one at a time anyway
        yield
        return
    exclusive = item.get_closest_marker(WHOLE_MACHINE) is not None
    turnstile = _lock(os.path.join(locks, "turnstile"), fcntl.LOCK_EX)
    try:
        held = _lock(os.path.join(locks, "tests"), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
        os.close(turnstile)
    try:
        yield
    finally:
        os.close(held)


def run_trio(fn: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    """Run `fn` in a fresh trio run (fresh otpmesh runtime) under a deadline."""

    async def main() -> Any:
        with trio.fail_after(timeout * SLOWDOWN):
            return await fn()

    return trio.run(main)


def run_program(path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """Write `source` to `path` and run it as a user would: a fresh interpreter, the fork
    server preloading what it does by default (no OTPMESH_PRELOAD from the test run)."""
    path.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "OTPMESH_PRELOAD"}
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=env
    )


INTERRUPTED = "otpmesh: interrupted, all actors stopped"
TERMINATED = "otpmesh: terminated (SIGTERM), all actors stopped"
SLOW_STOP = "otpmesh: stopping: waiting for "


def stop_notices(err: str, closing: str = INTERRUPTED) -> list[str]:
    """Check that a program stopped by Ctrl-C (or SIGTERM: `closing` = TERMINATED) ended its
    stderr with the one closing line, and return what it said before it: nothing, or (a stop
    slower than a second, which load alone can make) notices of what it was waiting for, no
    traceback."""
    *notices, last = err.strip().splitlines() or [""]
    assert last == closing, err
    assert all(notice.startswith(SLOW_STOP) for notice in notices), err
    return notices


def free_port() -> int:
    """A TCP port free on loopback now (for a process that must be told its port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _our_forkservers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"otpmesh._runtime._forkserver" in cmd and ppid == os.getpid():
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True, scope="session")
def no_leftover_fork_servers() -> Any:
    yield
    # Each trio run's fork server exits once its controller socket closes; give it a moment.
    for _ in range(50):
        if not _our_forkservers():
            return
        time.sleep(0.1)
    pytest.fail(f"fork servers outlived their trio runs: {_our_forkservers()}")


#: The second Unix user the security tests act as (made with useradd the first time).
ATTACKER_USER = "otpmesh-attacker"


def other_user() -> str:
    """A second Unix user's name, made if need be; skips the test where that cannot be done."""
    if os.getuid() != 0:
        pytest.skip("needs root to create a second Unix user (useradd) and run as it")
    try:
        pwd.getpwnam(ATTACKER_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed")
        subprocess.run(["useradd", "--no-create-home", ATTACKER_USER], check=True)
    return ATTACKER_USER


def vm_kib(field: str) -> int:
    """A field of this process's /proc/self/status in KiB ("VmHWM": its peak RSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM, Linux >= 4.0); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    """While the block runs this process can open no new descriptor: every open, socket and
    accept fails with EMFILE.

    The soft RLIMIT_NOFILE becomes the lowest free descriptor number, not the count of open
    ones: earlier tests in the same process (an xdist worker runs many files) leave holes in
    the descriptor table, numbers closed below ones still open, and every hole under a limit
    set from the count was one more descriptor the kernel still handed out. Garbage is
    collected first, so that no socket of an earlier test is closed inside the block, which
    would open a hole under the limit."""
    gc.collect()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)  # the kernel gives the lowest free number
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
