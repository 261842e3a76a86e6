"""A caller that waits for its reply on the socket itself (``Connection.read_for``), in the
connection reader's place: it handles what arrives exactly as the reader would (in order, once,
whatever else comes with its reply), and every way its wait can end hands the socket back to
the reader. Real socket pairs; the peer's bytes are written by the test."""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable
from typing import Any

import pytest
import trio

import otpmesh
from otpmesh import Mesh, Supervisor, Worker
from otpmesh._node import _calls
from otpmesh._wire import _connection
from otpmesh._wire._connection import Connection
from tests.actors import Echo
from tests.conftest import run_trio


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


class _Link:
    """A Connection over one end of a socket pair; the test writes the other end. Records each
    message it handled and which task handled it."""

    def __init__(self) -> None:
        left, self.peer = socket.socketpair()
        left.setblocking(False)
        self.got: list[bytes] = []
        self.by: list[str] = []
        self.stall: dict[bytes, trio.Event] = {}  # a message whose handler must wait
        self.conn = Connection(left, peer="test", decode=lambda f: (f, ()), on_message=self._on)

    def _on(self, conn: Connection, message: Any, pending: Any) -> Awaitable[None] | None:
        self.got.append(message)
        self.by.append(trio.lowlevel.current_task().name)
        event = self.stall.get(message)
        return None if event is None else event.wait()

    def send(self, *payloads: bytes) -> None:
        self.peer.sendall(b"".join(_frame(p) for p in payloads))

    async def idle(self) -> None:
        """Until the reader waits for the socket (or a caller to hand it back)."""
        while not self.conn._idle:
            await trio.sleep(0)

    async def handled(self, count: int) -> None:
        while len(self.got) < count:
            await trio.sleep(0)


async def _run(link: _Link, nursery: trio.Nursery) -> None:
    nursery.start_soon(link.conn.run, name="reader")
    await link.idle()


def test_the_caller_reads_its_reply_and_what_came_before_it_in_order_then_hands_back() -> None:
    async def body() -> _Link:
        link = _Link()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)

            async def caller() -> None:
                await link.conn.read_for(lambda: b"reply" in link.got)

            nursery.start_soon(caller, name="caller")
            while not link.conn._lent_out():
                await trio.sleep(0)
            link.send(b"first", b"second")
            await link.handled(2)
            link.send(b"reply")
            await link.handled(3)
            await link.idle()
            assert not link.conn._lent_out()
            link.send(b"after")  # the reader has the socket again
            await link.handled(4)
            nursery.cancel_scope.cancel()
        return link

    link = run_trio(body, timeout=30)
    assert link.got == [b"first", b"second", b"reply", b"after"]
    assert link.by == ["caller", "caller", "caller", "reader"]


def test_a_caller_cancelled_while_it_reads_hands_the_socket_back() -> None:
    async def body() -> _Link:
        link = _Link()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            with trio.move_on_after(0.05):
                await link.conn.read_for(lambda: False)
            assert not link.conn._lent_out()
            link.send(b"later")
            await link.handled(1)
            nursery.cancel_scope.cancel()
        return link

    link = run_trio(body, timeout=30)
    assert link.by == ["reader"]


def test_a_message_whose_handler_must_wait_is_waited_for_by_the_reader_before_the_next() -> None:
    """A full mailbox pauses reading (backpressure): the caller leaves that wait to the reader,
    and nothing after the message is handled until it is over."""

    async def body() -> _Link:
        link = _Link()
        go = link.stall[b"slow"] = trio.Event()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            link.send(b"slow", b"behind it")
            await link.conn.read_for(lambda: False)  # returns once it meets the wait
            assert link.got == [b"slow"]
            for _ in range(50):
                await trio.sleep(0)
            assert link.got == [b"slow"]
            go.set()
            await link.handled(2)
            nursery.cancel_scope.cancel()
        return link

    link = run_trio(body, timeout=30)
    assert link.got == [b"slow", b"behind it"]
    assert link.by[0] != "reader" and link.by[1] == "reader"


@pytest.mark.parametrize("end", ["broken frame", "end of stream"])
def test_what_ends_the_connection_while_a_caller_reads_ends_it_as_the_reader_would(
    end: str,
) -> None:
    async def body() -> Connection:
        link = _Link()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)

            async def ended() -> None:
                if end == "broken frame":
                    link.peer.sendall(struct.pack(">I", 1 << 31))  # over the frame limit
                else:
                    link.peer.close()

            nursery.start_soon(ended)
            await link.conn.read_for(lambda: False)
        return link.conn

    conn = run_trio(body, timeout=30)
    assert conn.closed
    reason = conn.close_reason or ""
    if end == "broken frame":
        assert reason.startswith("protocol error: frame of"), reason
    else:
        assert reason == "connection closed by peer", reason


def test_a_caller_that_comes_while_the_socket_woke_the_reader_leaves_the_reading_to_it() -> None:
    """The reply arrived and the reader is rescheduled, but has not run yet, when the caller
    asks for the socket: neither may lose the frame, and neither may read it twice."""

    async def body() -> tuple[_Link, int]:
        link = _Link()
        raced = 0
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            for i in range(200):
                await link.idle()
                reply = b"reply %d" % i
                link.send(reply)
                await trio.lowlevel.checkpoint()  # epoll reports it: the reader is woken
                if link.conn._reader_waits:  # woken, not run yet: the window
                    raced += 1
                with trio.fail_after(5):
                    await link.conn.read_for(lambda: reply in link.got)  # noqa: B023
                    await link.handled(i + 1)
            nursery.cancel_scope.cancel()
        return link, raced

    link, raced = run_trio(body, timeout=60)
    assert link.got == [b"reply %d" % i for i in range(200)]
    assert raced > 0, "the window was never hit"


def test_a_unicast_call_to_a_worker_is_answered_on_the_callers_own_task() -> None:
    """``ref.ep(x)``: its reply is handled by the calling task (the reader does not wake it);
    a mesh call's replies, on several connections, are delivered by the readers."""
    tasks: list[trio.lowlevel.Task] = []
    deliver = _calls.CallGroup.deliver

    def recording(self: _calls.CallGroup, index: int, ok: bool, value: Any) -> None:
        tasks.append(trio.lowlevel.current_task())
        deliver(self, index, ok, value)

    tree = Supervisor("s", children=[Worker("e", Echo)])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref = app.actor("s/e")
            await ref.echo(0)
            await app.settled()
            me = trio.lowlevel.current_task()
            _calls.CallGroup.deliver = recording  # type: ignore[method-assign]
            try:
                for i in range(20):
                    assert await ref.echo(i) == i
            finally:
                _calls.CallGroup.deliver = deliver  # type: ignore[method-assign]
            assert tasks and all(t is me for t in tasks), [t.name for t in tasks]

    run_trio(body)


def test_a_caller_does_not_wake_a_writer_that_waits_for_the_socket() -> None:
    """Taking the socket from a waiting reader wakes every task waiting on it: a writer waiting
    for the peer to read must not be woken (it would take that for a closed socket)."""

    async def body() -> tuple[_Link, bytes]:
        link = _Link()
        big = b"x" * (8 << 20)
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            link.conn.send_nowait(big)  # more than the socket holds: the writer waits
            while not link.conn._writing:
                await trio.sleep(0)
            await trio.sleep(0.05)
            with trio.move_on_after(0.05):
                await link.conn.read_for(lambda: False)
            assert not link.conn.closed, link.conn.close_reason
            received = bytearray()
            with trio.fail_after(20):
                while len(received) < len(big) + 4:
                    try:
                        received += link.peer.recv(1 << 20, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        await trio.sleep(0.001)
            link.send(b"done")
            await link.handled(1)
            nursery.cancel_scope.cancel()
        return link, bytes(received[4:])

    link, received = run_trio(body, timeout=60)
    assert received == b"x" * (8 << 20)
    assert link.got == [b"done"]


def test_with_other_calls_out_on_the_connection_the_reader_delivers() -> None:
    """Pipelined calls' replies come together: one reader delivers them in one pass. (A caller
    that took the socket here would wait for ever: nothing it reads ends its wait.)"""

    async def body() -> _Link:
        link = _Link()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            link.conn.pending = {0: None, 1: None}
            with trio.fail_after(5):
                await link.conn.read_for(lambda: False)
            link.send(b"reply")
            await link.handled(1)
            link.conn.pending = {}
            nursery.cancel_scope.cancel()
        return link

    assert run_trio(body, timeout=30).by == ["reader"]


# A wide call's caller, its frames out, sweeps its connections once (``read_waiting``): what is
# already there is handled in its pass, without waking the readers; the rest is theirs.


def test_a_sweep_handles_what_is_already_there_in_order_and_leaves_the_rest() -> None:
    async def body() -> _Link:
        link = _Link()
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            assert link.conn._reader_waits
            link.send(b"one", b"two")
            link.conn.read_waiting()  # no checkpoint since the send: the reader was not woken
            assert link.got == [b"one", b"two"]
            link.conn.read_waiting()  # nothing there: nothing happens
            link.send(b"three")
            await link.handled(3)
            nursery.cancel_scope.cancel()
        return link

    link = run_trio(body, timeout=30)
    assert link.by[:2] == [link.by[0]] * 2 and link.by[0] != "reader"
    assert link.by[2] == "reader"


def test_a_sweep_leaves_a_wait_and_a_broken_frame_to_the_reader() -> None:
    async def body() -> tuple[_Link, _Link]:
        waits, broken = _Link(), _Link()
        go = waits.stall[b"slow"] = trio.Event()
        async with trio.open_nursery() as nursery:
            await _run(waits, nursery)
            await _run(broken, nursery)
            waits.send(b"slow", b"behind it")
            broken.peer.sendall(struct.pack(">I", 1 << 31))
            waits.conn.read_waiting()
            broken.conn.read_waiting()
            assert waits.got == [b"slow"] and broken.conn.close_reason is None
            for _ in range(20):
                await trio.sleep(0)
            assert waits.got == [b"slow"]  # nothing behind it until the wait is over
            go.set()
            await waits.handled(2)
            while not broken.conn.closed:
                await trio.sleep(0)
            nursery.cancel_scope.cancel()
        return waits, broken

    waits, broken = run_trio(body, timeout=30)
    assert waits.got == [b"slow", b"behind it"] and waits.by[1] == "reader"
    assert (broken.conn.close_reason or "").startswith("protocol error: frame of")


def test_a_broadcast_to_many_processes_sweeps_each_connection_once_and_is_answered_once() -> None:
    """What a sweep finds depends on how fast the workers answer (the tests above pin down what
    it does with it); here: a real broadcast to 16 processes sweeps each of its connections
    once, after its frames are out, and every actor answers once, with its own value."""
    swept: list[Connection] = []
    sweep = Connection.read_waiting

    def counting(self: Connection) -> None:
        swept.append(self)
        sweep(self)

    tree = Supervisor("s", children=[Mesh("m", Echo, shape={"procs": 16})])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            mesh = app.mesh("s/m")
            await mesh.echo.call(0)
            await app.settled()
            Connection.read_waiting = counting  # type: ignore[method-assign]
            try:
                for i in range(20):
                    before = len(swept)
                    values = await mesh.echo.call(i)
                    assert list(values.values()) == [i] * 16
                    assert len(set(swept[before:])) == len(swept) - before == 16
            finally:
                Connection.read_waiting = sweep  # type: ignore[method-assign]

    run_trio(body, timeout=120)


def test_a_peer_that_keeps_the_socket_full_does_not_starve_the_callers_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that fills its buffer means more is waiting: a caller reading in the reader's
    place lets other tasks run every few such reads, as the reader does, or a peer that never
    lets the socket empty (and never sends the reply) holds the whole process. Reads of 64
    bytes here, so that a socket pair's buffer holds many full reads."""
    monkeypatch.setattr(_connection, "_RECV_CHUNK", 64)

    async def body() -> tuple[int, int]:
        link = _Link()
        ran_at: list[int] = []
        async with trio.open_nursery() as nursery:
            await _run(link, nursery)
            frames = [b"frame %03d" % i for i in range(200)]
            link.send(*frames)

            async def other() -> None:  # runs at every checkpoint until the reading began
                while not link.got:
                    await trio.sleep(0)
                ran_at.append(len(link.got))

            nursery.start_soon(other)
            await link.conn.read_for(lambda: bool(ran_at))
            await link.handled(len(frames))
            nursery.cancel_scope.cancel()
        return ran_at[0], len(link.got)

    ran_at, handled = run_trio(body, timeout=30)
    assert handled == 200
    assert 0 < ran_at < 200, f"the other task ran after {ran_at} of 200 frames"
