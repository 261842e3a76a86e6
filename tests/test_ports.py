"""Ports and channels (otpmesh.Channel, @endpoint(reply_port=True)) over real processes."""

from __future__ import annotations

import gc

import msgpack
import pytest
import trio

import otpmesh
from otpmesh import ONE_FOR_ONE, Supervisor, Worker, chaos
from otpmesh._node._node import current_node
from otpmesh._node._porttable import ERROR, PortTable
from otpmesh._wire import _codec
from otpmesh._wire._frames import PORT, decode_message
from otpmesh._wire._framing import frame_header
from otpmesh._wire._handshake import dial
from tests.conftest import run_trio
from tests.port_actors import AioLater, Later, Producer

TREE = Supervisor("s", intensity=10, children=[Worker("later", Later)], strategy=ONE_FOR_ONE)


@pytest.mark.timeout(60)
def test_reply_later_answers_the_first_caller_from_another_endpoint() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            later = (await procs.spawn("later", Later))[0]
            got: list[str] = []

            async def ask(endpoint: otpmesh.Endpoint, question: str) -> None:
                got.append(await endpoint(question))

            async with trio.open_nursery() as nursery:  # a plain def endpoint and an async one
                nursery.start_soon(ask, later.ask, "why")
                nursery.start_soon(ask, later.ask_async, "how")
                while await later.pending() < 2:
                    await trio.sleep(0.01)
                assert got == []  # the endpoints returned; their callers still wait
                assert await later.answer("?") == 2
            assert sorted(got) == ["how?", "why?"]
            assert await later.twice(5) == 5  # one reply per call: the second send is dropped
            with pytest.raises(otpmesh.ActorError, match="ValueError: no thanks"):
                await later.refuse("no thanks")
            assert await later.pid() > 0  # the actor lives on after port.exception

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_reply_port_travels_to_another_actor_which_replies() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("later", Later)
            async with trio.open_nursery() as nursery:
                got: list[int] = []

                async def ask() -> None:
                    got.append(await mesh[0].delegate(mesh[1], 4))

                nursery.start_soon(ask)
                while not await mesh[0].hand_over():  # until delegate has run
                    await trio.sleep(0.01)
            assert got == [40]
            replies = await mesh.twice(3)  # a call to every actor: each one's first value
            assert replies.values() == [3, 3]
            await mesh.twice.broadcast(1)  # a cast's reply port drops what is sent on it
            assert (await mesh.pending()).values() == [0, 0]

    run_trio(body)


@pytest.mark.timeout(60)
def test_ports_work_from_an_asyncio_actors_code() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            aio = (await procs.spawn("aio", AioLater))[0]
            assert await aio.ask(21) == 42
            assert await aio.roundtrip(5) == [0, 1, 2, 3, 4]

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_channel_port_passed_to_a_mesh_of_four_gets_every_value() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=4) as procs:
            producers = await procs.spawn("producers", Producer)
            port, receiver = otpmesh.Channel[tuple[int, int]].open()
            await producers.produce(port, 3)
            got = [await receiver.recv() for _ in range(12)]
            assert sorted(got) == [(rank, i) for rank in range(4) for i in range(3)]
            for rank in range(4):  # each sender's values arrive in the order it sent them
                assert [i for r, i in got if r == rank] == [0, 1, 2]
            await producers[2].close(port)
            assert [v async for v in receiver] == []  # closed: async for ends
            with pytest.raises(otpmesh.PortClosedError, match="closed by a sender"):
                await receiver.recv()
            # A channel between actors: producers/0 opens it, the others fill it.
            gathered = await producers[0].gather_from(producers.slice(procs=slice(1, 4)), 2)
            assert gathered == [(rank, i) for rank in (1, 2, 3) for i in range(2)]
            # A receiver nobody holds any more is gone: what is sent to its port is dropped.
            node = current_node()
            assert node is not None
            port, receiver = otpmesh.Channel[tuple[int, int]].open()
            gone = node.ports.statistics().gone
            del receiver
            gc.collect()
            await producers[1].produce(port, 2)
            while node.ports.statistics().gone < gone + 2:
                await trio.sleep(0.01)

    run_trio(body)


async def _ask_until_it_fails(later: otpmesh.ActorRef, errors: list[BaseException]) -> None:
    try:
        await later.ask("never answered")
    except otpmesh.ActorDiedError as exc:
        errors.append(exc)


@pytest.mark.timeout(60)
def test_a_large_tensor_sent_on_a_port_goes_over_the_tensor_channel_in_order() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            producer = (await procs.spawn("big", Producer))[0]
            port, receiver = otpmesh.Channel.open()
            await producer.big(port, 4)
            big, small = await receiver.recv(), await receiver.recv()
            assert (big.numel(), float(big.sum()), small.numel()) == (1 << 20, 1 << 20, 2)

    run_trio(body)


@pytest.mark.timeout(90)
def test_a_reply_port_whose_actor_crashes_or_is_killed_fails_its_caller() -> None:
    async def body() -> None:
        async with otpmesh.start(TREE) as app:
            later = app.actor("s/later")
            for fault in ("crash", "kill"):
                pid = await later.pid()
                async with trio.open_nursery() as nursery:
                    errors: list[BaseException] = []

                    nursery.start_soon(_ask_until_it_fails, later, errors)
                    while await later.pending() == 0:
                        await trio.sleep(0.01)
                    if fault == "crash":
                        with pytest.raises(otpmesh.ActorError, match="crashed before replying"):
                            await later.crash()
                    else:
                        await chaos.kill(app, "s/later")
                assert len(errors) == 1 and errors[0].delivered  # type: ignore[attr-defined]
                await app.settled()
                assert await later.pending() == 0  # restarted: a fresh incarnation
                assert (await later.pid() != pid) == (fault == "kill")

    run_trio(body, timeout=90)


@pytest.mark.timeout(60)
def test_a_forged_port_is_refused_and_the_real_one_still_works() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            forger = (await procs.spawn("forger", Producer))[0]
            port, receiver = otpmesh.Channel[str].open()
            await forger.forge(port)
            await forger.produce(port, 1)  # after the forged sends, on the same connection
            assert await receiver.recv() == (0, 0)  # type: ignore[comparison-overlap]
            node = current_node()
            assert node is not None
            stats = node.ports.statistics()
            assert stats.forged == 1 and stats.gone == 1
            assert receiver.statistics().received == 1

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_raw_peer_is_refused_a_forged_token_and_closed_for_a_malformed_port_frame() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            later = (await procs.spawn("later", Later))[0]
            node = current_node()
            assert node is not None
            port, receiver = otpmesh.Channel[str].open()
            addr, port_id, token = port._to_wire()
            sock, _ = await dial(addr, node.secret_for(addr))  # a peer with the app's secret

            def send(frame: list[object]) -> None:
                data = msgpack.packb(frame)
                sock.sendall(frame_header(len(data)) + data)

            send([PORT, port_id, bytes(16), 0, "forged"])
            send([PORT, port_id, token, 0, "genuine"])  # the same connection: still open
            assert await receiver.recv() == "genuine"
            assert node.ports.statistics().forged == 1
            send([PORT, port_id, b"short", 0, "malformed"])
            sock.settimeout(30)
            assert await trio.to_thread.run_sync(sock.recv, 1) == b"", "not closed"
            sock.close()
            assert await later.pid() > 0  # the app keeps answering
            port.send("after")
            assert await receiver.recv() == "after"
            assert receiver.statistics().received == 2

    run_trio(body)


@pytest.mark.timeout(60)
def test_a_flood_to_a_receiver_nobody_reads_stays_bounded() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            flooder = (await procs.spawn("flooder", Producer))[0]
            port, receiver = otpmesh.Channel[int].open(capacity=8)
            await flooder.flood(port, 5000)
            while receiver.statistics().received + receiver.statistics().dropped < 5000:
                await trio.sleep(0.01)
            stats = receiver.statistics()
            assert (stats.queued, stats.received, stats.dropped) == (8, 8, 4992)
            assert [await receiver.recv() for _ in range(8)] == list(range(8))
            with pytest.raises(otpmesh.PortOverflowError, match="more than 8 values arrived"):
                await receiver.recv()

    run_trio(body)


def test_a_malformed_port_is_a_protocol_error() -> None:
    def ext(fields: object) -> bytes:
        return msgpack.packb(msgpack.ExtType(_codec.EXT_PORT, msgpack.packb(fields)))

    token = bytes(16)
    for fields, match in [
        (["addr", 1], "port payload: it has 2 fields"),
        (["addr", 1, "token"], "field 2 is"),
        (["addr", -1, token], "port id -1"),
        (["addr", 1, b"short"], "a token of 5 bytes"),
        (["", 1, token], "owner address of 0 characters"),
        (["x" * 600, 1, token], "owner address of 600 characters"),
    ]:
        with pytest.raises(otpmesh.ProtocolError, match=match):
            _codec.unpack(ext(fields))
    port = _codec.unpack(ext(["addr", 1, token]))
    assert isinstance(port, otpmesh.Port) and "0000" not in repr(port)  # no token in a repr


class _Conn:
    peer = "test peer"


def test_a_malformed_port_frame_is_a_protocol_error() -> None:
    table = PortTable(None)  # type: ignore[arg-type]  # refused before it touches its node
    good = [PORT, 1, bytes(16), 0, "v"]
    decode_message(msgpack.packb(good))  # the frame's arity is checked when it is decoded
    with pytest.raises(otpmesh.ProtocolError, match="needs 5 fields"):
        decode_message(msgpack.packb(good[:4]))
    for frame, match in [
        ([PORT, -1, bytes(16), 0, "v"], "bad port id"),
        ([PORT, 1, bytes(3), 0, "v"], "bad port token"),
        ([PORT, 1, bytes(16), 7, "v"], "bad port frame kind 7"),
        ([PORT, 1, bytes(16), ERROR, ["a", "b"]], "malformed port error"),
    ]:
        with pytest.raises(otpmesh.ProtocolError, match=match):
            table.arrived(_Conn(), frame)  # type: ignore[arg-type]


def test_channel_open_teaches_where_it_works_and_what_capacity_is() -> None:
    async def outside_any_app() -> None:
        otpmesh.Channel.open()

    with pytest.raises(otpmesh.MeshError, match="inside an actor, or in the controller"):
        trio.run(outside_any_app)
    with pytest.raises(ValueError, match="capacity=0"):
        otpmesh.Channel.open(capacity=0)
    with pytest.raises(TypeError, match="first parameter after self"):

        class Bad(otpmesh.Actor):
            @otpmesh.endpoint(reply_port=True)
            def ask(self, *, port: object) -> None: ...
