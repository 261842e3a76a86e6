"""The fork server's standby socket against a same-user dialer that never proves itself: the
server goes on forking and reporting while the dialer waits, a flood of silent dialers holds a
bounded number of places, and a real standby still attaches through it (a real fork server
process, real Unix sockets)."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from otpmesh import FencedError
from otpmesh._runtime._forkclient import ForkServer
from otpmesh._runtime._forkstandby import FAIR_CHANCE, MAX_PENDING, attach_proof, dial_standby
from otpmesh._runtime._lease import Lease

SECRET = b"s" * 32


def _silent_dialer(path: Path) -> socket.socket:
    """Connect to the standby socket, read its challenge, and say nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    assert msgpack.unpackb(sock.recv(1 << 16))["op"] == "challenge"
    return sock


def _hung_up(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (EOF readable now), without waiting."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1 << 16, socket.MSG_DONTWAIT) == b""


def _lease_held(tmp_path: Path, epoch: int) -> Lease:
    """The takeover's lease in `tmp_path`, held by this process, and its epoch file at `epoch`
    (what a standby that took the lease wrote)."""
    lease = Lease(tmp_path)
    assert lease.try_acquire()
    _write_epoch(tmp_path, epoch)
    return lease


def _write_epoch(tmp_path: Path, epoch: int) -> None:
    (tmp_path / "epoch").write_text(f"{epoch}\n")


async def _with_fork_server(tmp_path: Path, body: Any) -> None:
    path = tmp_path / "forkserver.sock"
    reports: list[dict[str, Any]] = []
    spawned = trio.Event()

    def on_report(msg: dict[str, Any]) -> None:
        reports.append(msg)
        if msg["op"] == "spawned":
            spawned.set()

    server = ForkServer(on_report, lambda: None)
    standby = {
        "socket": str(path),
        "lease": str(tmp_path / "lease"),
        "epoch_file": str(tmp_path / "epoch"),
        "grace": 30.0,
        "secret": SECRET,
        "epoch": 1,
    }
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, standby)
        await server.ready.wait()
        with trio.fail_after(30):
            while not path.exists():  # its listener comes with the "takeover" it was sent
                await trio.sleep(0.01)
        try:
            await body(server, path, spawned)
        finally:
            server.quit()


def test_a_dialer_that_never_proves_itself_does_not_stall_the_fork_server(
    tmp_path: Path,
) -> None:
    """The server reads a dialer's proof in its select loop: a spawn asked while a dialer owes
    its proof is answered while that dialer is still connected. Before, the server waited for
    the proof (up to 2 s) and closed the dialer before it served anything else."""

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        dialer = await trio.to_thread.run_sync(_silent_dialer, path)
        try:
            # A config the worker cannot start from: the child exits; its "spawned" is the reply.
            fds = await server.spawn("p1", {}, {})
            await spawned.wait()
            assert not _hung_up(dialer), "the server waited out the silent dialer first"
            for fd in fds:
                os.close(fd)
        finally:
            dialer.close()

    trio.run(_with_fork_server, tmp_path, body)


_SILENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.recv(1 << 16)  # the challenge
print("challenged", flush=True)
print("hung up" if s.recv(1 << 16) == b"" else "spoke", flush=True)  # never a byte from us
"""


def _silent_process(path: Path) -> subprocess.Popen[str]:
    """A process that dials, reads its challenge, and says nothing (a place of its own: the
    server keeps one place per process); "hung up" on its stdout once the server drops it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SILENT, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "challenged\n"
    return proc


def _hung_up_process(proc: subprocess.Popen[str]) -> bool:
    return proc.poll() is not None


def test_silent_dialers_hold_a_bounded_number_of_places_and_a_standby_still_attaches(
    tmp_path: Path,
) -> None:
    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        dialers = []
        try:
            for _ in range(MAX_PENDING + 1):
                dialers.append(await trio.to_thread.run_sync(_silent_process, path))
            # The oldest is evicted once one more than MAX_PENDING waits (after its fair
            # chance); the rest still wait.
            await trio.to_thread.run_sync(dialers[0].wait, 30.0)
            assert dialers[0].stdout is not None and dialers[0].stdout.read() == "hung up\n"
            assert not any(_hung_up_process(d) for d in dialers[1:])
            lease = _lease_held(tmp_path, 2)
            server.detach()  # its controller died: a standby may attach now
            standby = ForkServer(lambda msg: None, lambda: None)
            async with trio.open_nursery() as nursery:
                children = await nursery.start(standby.attach, str(path), SECRET, 2)
                assert children == []
                standby.quit()
            lease.release()
        finally:
            for d in dialers:
                d.kill()
                d.wait()

    trio.run(_with_fork_server, tmp_path, body)


def test_a_process_dialing_again_takes_its_own_older_place_not_anothers(tmp_path: Path) -> None:
    """A process holds one place: its newer dial replaces its older one, and leaves the other
    processes' places alone."""

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        other = await trio.to_thread.run_sync(_silent_process, path)
        try:
            first = await trio.to_thread.run_sync(_silent_dialer, path)
            second = await trio.to_thread.run_sync(_silent_dialer, path)
            await trio.to_thread.run_sync(select.select, [first], [], [], 30.0)
            assert _hung_up(first)
            assert not _hung_up(second)
            assert not _hung_up_process(other)
            first.close()
            second.close()
        finally:
            other.kill()
            other.wait()

    trio.run(_with_fork_server, tmp_path, body)


def _slow_prover(path: Path, epoch: int, delay: float) -> str:
    """Attach by hand, answering the challenge only after `delay`; the server's reply's op (a
    server that answers "ready" is then told to quit)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(str(path))  # blocking: it waits its turn in the listener's backlog
        nonce = msgpack.unpackb(sock.recv(1 << 16))["nonce"]
        time.sleep(delay)
        proof = attach_proof(SECRET, nonce, epoch)
        sock.send(msgpack.packb({"op": "attach", "epoch": epoch, "proof": proof}))
        reply = sock.recv(1 << 16)
        op = "hung up" if not reply else str(msgpack.unpackb(reply)["op"])
        if op == "ready":  # attached: this is the fork server's controller now, and ends it
            sock.send(msgpack.packb({"op": "quit"}))
        return op


_FLOOD = """
import socket, sys, time
held = []
while True:  # connect as fast as it can, never a byte: the backlog full, the places churned
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close()
        continue
    held.append(s)
    if len(held) > 64:
        held.pop(0).close()
"""


def test_a_flood_of_dialers_without_the_secret_does_not_keep_a_standby_out(
    tmp_path: Path,
) -> None:
    """Same-user processes without the secret connect to the standby socket in a loop (two
    with blocking connects, two spinning on non-blocking ones) while standbys attach, one after
    another at rising epochs: each attaches. Before, a dial failed about one time in two (the
    backlog full: ENOTCONN; or evicted before its proof was read: "it hung up"), and a standby
    took that for a fork server gone: it started afresh and the fork server's children, their
    actors' state with them, were lost."""

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        floods = _floods(path, 2, "blocking") + _floods(path, 2, "spinning")
        lease = _lease_held(tmp_path, 1)
        try:
            await trio.sleep(0.5)  # the flood is on
            controller = server
            async with trio.open_nursery() as nursery:
                for epoch in range(2, 7):  # each dies before the next takes over
                    controller.detach()
                    _write_epoch(tmp_path, epoch)
                    controller = ForkServer(lambda msg: None, lambda: None)
                    children = await nursery.start(controller.attach, str(path), SECRET, epoch)
                    assert children == []
                controller.quit()  # the last one attached ends the fork server
        finally:
            lease.release()
            for flood in floods:
                flood.kill()
                flood.wait()

    trio.run(_with_fork_server, tmp_path, body)


def _floods(path: Path, count: int, how: str) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", _FLOOD, str(path), how]) for _ in range(count)]


def test_a_slow_prover_keeps_its_place_through_a_flood_from_more_processes_than_places(
    tmp_path: Path,
) -> None:
    """A standby that answers its challenge 0.2 s late (a loaded machine) attaches while more
    processes than there are places flood the socket: it keeps its place for FAIR_CHANCE
    however fast the others dial. Before, the flood evicted it within a few accepts, every
    time ("it hung up")."""
    assert 0.2 < FAIR_CHANCE

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        floods = _floods(path, MAX_PENDING + 2, "blocking")
        lease = _lease_held(tmp_path, 2)
        server.detach()
        try:
            await trio.sleep(0.5)  # the flood is on
            got = await trio.to_thread.run_sync(_slow_prover, path, 2, 0.2)
            assert got == "ready"
        finally:
            lease.release()
            for flood in floods:
                flood.kill()
                flood.wait()

    trio.run(_with_fork_server, tmp_path, body)


def test_a_dialer_with_the_secret_cannot_attach_while_the_controller_is_attached(
    tmp_path: Path,
) -> None:
    """Every actor of the app knows its secret: one that dials the standby socket at a higher
    epoch while its controller lives is refused, and the controller keeps its fork server
    (it still forks). Before, the server attached it and fenced the live controller: it
    marked every worker dead and could no longer fork, and the app ended."""

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        lease = _lease_held(tmp_path, 2**40)  # even the lease and a matching epoch file
        try:
            with pytest.raises(FencedError, match="its controller is attached"):
                await dial_standby(str(path), SECRET, 2**40)
        finally:
            lease.release()
        fds = await server.spawn("p1", {}, {})
        with trio.fail_after(30):
            await spawned.wait()  # still its fork server
        for fd in fds:
            os.close(fd)

    trio.run(_with_fork_server, tmp_path, body)


_DIAL = """
import sys, trio
from otpmesh._runtime._forkstandby import dial_standby
from otpmesh import FencedError
try:
    trio.run(dial_standby, sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]))
except FencedError as exc:
    print(exc)
else:
    print("attached")
"""


@pytest.mark.parametrize("epoch_written", [2, 3])
def test_once_the_controller_is_gone_only_the_lease_holder_attaches(
    tmp_path: Path, epoch_written: int
) -> None:
    """With the controller gone, a process with the secret that does not hold the lease (an
    actor racing the standby) is refused; the holder then attaches at the epoch it wrote, and
    not at another."""

    async def body(server: ForkServer, path: Path, spawned: trio.Event) -> None:
        lease = _lease_held(tmp_path, epoch_written)
        server.detach()
        try:
            out = await trio.run_process(
                [sys.executable, "-c", _DIAL, str(path), SECRET.decode(), "2"],
                capture_stdout=True,
            )
            assert "does not hold the takeover's lease" in out.stdout.decode()
            if epoch_written != 2:
                with pytest.raises(FencedError, match="not the one its lease holder wrote"):
                    await dial_standby(str(path), SECRET, 2)
            _write_epoch(tmp_path, 2)
            standby = ForkServer(lambda msg: None, lambda: None)
            async with trio.open_nursery() as nursery:
                assert await nursery.start(standby.attach, str(path), SECRET, 2) == []
                standby.quit()
        finally:
            lease.release()

    trio.run(_with_fork_server, tmp_path, body)
