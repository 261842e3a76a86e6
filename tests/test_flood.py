"""No listener can be exhausted by peers that have proved nothing (docs/security.md, "Bounded
cost"): floods of idle connections, half-sent handshakes and half-sent requests from another Unix
user or from a process of the app's user without its secret leave the app answering and
restarting its workers, and every accept loop waits out EMFILE instead of ending. Real
processes, real sockets; counts, not timings."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

import otpmesh
from otpmesh import Mesh, Supervisor
from otpmesh._node._admission import PROVEN_PER_PROCESS
from otpmesh._node._node import Node
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._wire._handshake import HANDSHAKE, dial
from otpmesh._wire._unproven import PER_LISTENER, PER_PEER, Unproven
from otpmesh.bench.flood import FloodedApp, Flooder
from otpmesh.rdma import _tcpwire
from tests.actors import Echo, Member
from tests.conftest import no_descriptor_left, other_user, run_trio
from tests.rdma.test_tcp_backend import _read, _served

# ---------------------------------------------------------------- the bound itself


def test_a_peer_past_its_share_evicts_its_own_oldest_a_full_listener_the_biggest_peers() -> None:
    bound = Unproven(per_listener=4, per_peer=2)
    evicted: list[str] = []

    async def connection(name: str, peer: str, task_status: trio.TaskStatus[None]) -> None:
        with bound.hold(peer) as slot:
            task_status.started()
            await trio.sleep_forever()
        assert slot.evicted
        evicted.append(name)

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            for name in ("flood1", "flood2", "flood3"):
                await nursery.start(connection, name, "flood")
            await trio.testing.wait_all_tasks_blocked()
            assert evicted == ["flood1"]  # past its share: its own oldest goes
            assert (len(bound), bound.holding("flood"), bound.evicted) == (2, 2, 1)
            for name in ("worker", "agent", "late"):
                await nursery.start(connection, name, name)
            await trio.testing.wait_all_tasks_blocked()
            # Full: the oldest of the peer holding the most goes, never a one-connection peer.
            assert evicted == ["flood1", "flood2"]
            assert (len(bound), bound.holding("flood"), bound.evicted) == (4, 1, 2)
            nursery.cancel_scope.cancel()
        assert len(bound) == 0

    trio.run(body)


# ---------------------------------------------------------------- the tcp backend


def test_the_tcp_backend_holds_a_bounded_share_of_half_sent_requests_per_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        owner, reader, data, entry = _served(writable=False)
        address = owner.listen()
        flood = []
        for n in range(PER_PEER * 4):
            sock = socket.create_connection(address)
            sock.sendall(b"\x00" if n % 2 else _tcpwire.LEN.pack(60) + b"\x85")  # half a request
            flood.append(sock)
        with trio.fail_after(20):
            while owner.unproven.evicted < PER_PEER * 3:
                await trio.sleep(0.01)
        assert len(owner.unproven) == PER_PEER  # the newest; the older ones were closed
        assert await _read(owner, reader, entry) == data  # a reader with a token: served
        closed = sum(sock.recv(1, socket.MSG_PEEK) == b"" for sock in flood[: PER_PEER * 3])
        assert closed == PER_PEER * 3
        for sock in flood:
            sock.close()

    with caplog.at_level(logging.WARNING, logger="otpmesh.rdma"):
        run_trio(body, timeout=60)
    evictions = [r for r in caplog.records if "evicted" in r.getMessage()]
    assert len(evictions) == 1  # one host: one line, the rest folded into later summaries


def test_a_non_ascii_token_is_refused_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        owner, reader, data, entry = _served(writable=False)
        address = owner.listen()
        fields = {"buffer": 1, "token": "é" * 32, "op": "read", "offset": 0, "nbytes": 16}
        request = msgpack.packb(fields)

        def ask() -> bytes:
            with socket.create_connection(address, timeout=10) as sock:
                sock.sendall(_tcpwire.LEN.pack(len(request)) + request)
                return sock.recv(100)

        for _ in range(20):
            assert await trio.to_thread.run_sync(ask) == b""  # closed, nothing moved
        assert await _read(owner, reader, entry) == data

    with caplog.at_level(logging.WARNING, logger="otpmesh.rdma"):
        run_trio(body, timeout=60)
    assert "Traceback" not in caplog.text
    assert [r.getMessage() for r in caplog.records] == [
        "refused 127.0.0.1: a transfer request whose token is not ASCII"
    ]


# ---------------------------------------------------------------- EMFILE in accept


def test_no_descriptor_is_left_even_where_earlier_tests_left_holes_in_the_table() -> None:
    """The EMFILE tests' premise, where an xdist worker ran other files first: descriptors
    closed below ones still open must not be handed out under the lowered limit."""
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]
    for fd in opened[:80]:
        os.close(fd)  # 80 holes under the 20 still open
    try:
        with no_descriptor_left(), pytest.raises(OSError, match="Too many open files"):
            socket.socket().close()
    finally:
        for fd in opened[80:]:
            os.close(fd)


def test_the_node_accept_loop_waits_out_emfile_logs_once_per_episode_and_the_app_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("e", Echo)
            node = (await runtime()).node
            for episode in (1, 2):
                clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
                with no_descriptor_left():
                    for client in clients:
                        client.connect(node.addr)  # queued: the node's accept fails (EMFILE)
                    with trio.fail_after(30):
                        while node.acceptors[False].failures < 3 * episode:
                            await trio.sleep(0.01)
                    # The app's other work goes on: calls on open connections need no new one.
                    assert await echo[0].echo("while short") == "while short"

                def answered(client: socket.socket) -> bytes:
                    with client:
                        client.settimeout(30)
                        client.sendall(HANDSHAKE)
                        return client.recv(len(HANDSHAKE))

                for client in clients:  # each is accepted once descriptors came back
                    assert await trio.to_thread.run_sync(answered, client) == HANDSHAKE
                assert node.acceptors[False].episodes == episode
            assert await echo[0].echo("answering") == "answering"

    with caplog.at_level(logging.INFO, logger="otpmesh.node"):
        run_trio(body, timeout=90)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("cannot accept connections now" in line for line in lines) == 2
    assert sum("accepts connections again" in line for line in lines) == 2


# ---------------------------------------------------------------- floods against an app


@pytest.mark.whole_machine  # 12 flooding processes, and deadlines
def test_a_same_user_flood_holding_every_unproven_slot_does_not_stop_a_restarted_worker() -> None:
    tree = Supervisor("root", children=[Mesh("m", Member, shape={"procs": 2}, intensity=3)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("root/m")
            rt = await runtime()
            before = (await mesh.pid()).values()
            addrs = [rt.node.addr] + [p.addr for p in rt.procs.values()]
            targets = ",".join(f"u:{addr.encode().hex()}" for addr in addrs)
            flooder = Flooder(targets, procs=12, per=15)
            try:
                bound = rt.node.unproven[False]
                with trio.fail_after(60):  # it holds every slot there is (and keeps reopening)
                    while len(bound) < PER_LISTENER or bound.evicted < PER_LISTENER:
                        await trio.sleep(0.05)
                for _ in range(2):  # twice: each replacement dials back through the flood
                    victim = (await mesh.pid()).values()[0]
                    os.kill(victim, signal.SIGKILL)
                    with trio.fail_after(60):
                        while (await _pid_when_up(mesh, 0)) in (victim, None):
                            await trio.sleep(0.05)
                assert await mesh[0].ping() == "root/m/0"
                assert (await mesh.pid()).values()[1] == before[1]
                assert len(bound) <= PER_LISTENER
            finally:
                flooder.stop()  # at once, even when cancelled: a kill and a reap

    run_trio(body, timeout=120)


async def _pid_when_up(mesh: Any, rank: int) -> int | None:
    try:
        pid: int = await mesh[rank].pid()
    except otpmesh.ActorDiedError:
        return None
    return pid


@pytest.mark.whole_machine  # 8 flooding processes, 2000 sockets
def test_another_users_flood_of_every_port_leaves_the_app_answering_and_restarting() -> None:
    user = other_user()
    app = FloodedApp(nofile=256)  # a lowered descriptor limit: exhaustion comes fast
    try:
        baseline = app.ask("ping 20")
        assert len(baseline["tcp"]) == 3  # the controller's and each worker's tcp backend
        flooder = Flooder(app.targets(), procs=8, per=60, user=user)
        try:
            opened = flooder.wait_opened(2000, timeout=30)
            assert app.ask("ping 20")["fds"] < 256  # still answering
            assert opened >= 2000  # many times more connections than the app has descriptors
            restarted = app.ask("kill 60")  # a worker SIGKILLed mid-flood comes back
            assert restarted["restarted"] not in baseline["pids"]
            app.ask("ping 20")
        finally:
            flooder.stop()
        give_up = time.monotonic() + 60  # once the flood stops, everything it held is closed
        status = app.ask("ping 20")
        while status["fds"] > baseline["fds"] and time.monotonic() < give_up:
            time.sleep(0.5)
            status = app.ask("ping 20")
        assert status["fds"] <= baseline["fds"]
    finally:
        app.close()
    assert app.process.returncode == 0


def test_large_values_on_one_host_open_no_tcp_port() -> None:
    app = FloodedApp(backends=None)  # the default backends: shared memory on one host
    try:
        assert app.status["tcp"] == []  # 2 MiB went both ways; nothing listens for it
    finally:
        app.close()


@pytest.mark.timeout(60)
def test_a_burst_of_dials_from_one_host_over_tcp_all_get_in() -> None:
    # Every process of one host shares that host's share of a TCP listener's unproven slots: a
    # burst past it (an agent's workers dialing back together, actors' first calls) evicts some
    # of its own mid-proof. A dialer that was evicted dials again, so all of them get in.
    async def body() -> None:
        secret = b"cluster secret for the burst test"
        server = Node("burst", secret=secret, tcp_secret=secret)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            addr = await server.listen_tcp("127.0.0.1")
            dialed: list[Any] = []

            async def one() -> None:
                sock, _mac = await dial(addr, secret)
                dialed.append(sock)

            async def burst() -> None:  # as other processes would: not in the listener's loop
                async with trio.open_nursery() as dialers:
                    for _ in range(4 * PER_PEER):
                        dialers.start_soon(one)

            await trio.to_thread.run_sync(trio.run, burst)
            assert len(dialed) == 4 * PER_PEER
            for sock in dialed:
                sock.close()
            nursery.cancel_scope.cancel()

    run_trio(body, timeout=50)


@pytest.mark.timeout(60)
def test_a_holder_of_the_secret_holds_a_bounded_number_of_connections() -> None:
    # Knowing the secret (a compromised actor, a child it forked) is no licence to fill the
    # controller's descriptor table: past the bound its new connections are closed, its
    # workers' actors still answer, and its slots come back when it closes what it held.
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("e", Echo)
            rt = await runtime()
            held: list[socket.socket] = []
            for _ in range(PROVEN_PER_PROCESS + 8):
                sock, _mac = await dial(rt.node.addr, rt.node.secret)
                held.append(sock)
            me = f"pid {os.getpid()}"
            with trio.fail_after(30):
                while rt.node.proven.get(me, 0) < PROVEN_PER_PROCESS:
                    await trio.sleep(0.01)
            closed: set[int] = set()
            with trio.fail_after(30):  # the ones past the bound are closed after their proof
                while len(closed) < 8:
                    for i, sock in enumerate(held):
                        sock.setblocking(False)
                        try:
                            if sock.recv(1) == b"":
                                closed.add(i)
                        except BlockingIOError:
                            pass
                    await trio.sleep(0.01)
            await trio.sleep(0.2)  # and no more than those
            assert len(closed) == 8 and rt.node.proven[me] == PROVEN_PER_PROCESS
            assert await echo[0].echo("still here") == "still here"
            for sock in held:
                sock.close()
            with trio.fail_after(30):
                while me in rt.node.proven:
                    await trio.sleep(0.01)
            assert rt.node.proven_strangers == 0

    run_trio(body, timeout=50)
