"""Peer-driven log lines (a refused HELLO, a frame that breaks the protocol, a failing node
operation cast by a peer) go through the node's rate-limited refusal log: once per peer at
WARNING, then folded into a summary, never once per connection at ERROR. Real processes, real
sockets."""

from __future__ import annotations

import logging

import msgpack
import pytest
import trio

import otpmesh
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._wire._connection import dial, frame_header
from otpmesh._wire._frames import HELLO
from tests.actors import Echo
from tests.conftest import run_trio


@pytest.mark.timeout(60)
def test_forged_hellos_are_refused_and_logged_once_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("e", Echo)
            rt = await runtime()
            hello = msgpack.packb([HELLO, {"proc": "p999", "addr": "nowhere", "pid": 1}])
            with caplog.at_level(logging.DEBUG, logger="otpmesh"):
                for _ in range(20):
                    sock, _ = await dial(rt.node.addr, rt.node.secret)
                    sock.sendall(frame_header(len(hello)) + hello)
                    sock.settimeout(30)
                    assert await trio.to_thread.run_sync(sock.recv, 1) == b""  # refused
                    sock.close()
            assert await echo[0].echo("still here") == "still here"
        every = [r for r in caplog.records if "worker HELLO" in r.getMessage()]
        about = [r for r in every if r.levelno > logging.DEBUG]
        assert len(about) == 1, [r.getMessage() for r in about]
        assert len(every) == 20  # the others at DEBUG, one each
        assert about[0].levelno == logging.WARNING
        assert "no worker process of this controller" in about[0].getMessage()
        assert "p999" in about[0].getMessage()

    run_trio(body, timeout=50)


@pytest.mark.timeout(60)
def test_broken_frames_from_a_peer_are_logged_once_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("e", Echo)
            rt = await runtime()
            junk = b"\xc1" * 8  # 0xc1 is never valid msgpack
            with caplog.at_level(logging.DEBUG, logger="otpmesh"):
                for _ in range(20):
                    sock, _ = await dial(rt.node.addr, rt.node.secret)
                    sock.sendall(frame_header(len(junk)) + junk)
                    sock.settimeout(30)
                    assert await trio.to_thread.run_sync(sock.recv, 1) == b""  # closed
                    sock.close()
            assert await echo[0].echo("still here") == "still here"
        every = [r for r in caplog.records if "closed it" in r.getMessage()]
        closed = [r for r in every if r.levelno > logging.DEBUG]
        assert len(closed) == 1, [r.getMessage() for r in closed]
        assert len(every) == 20  # the others at DEBUG, one each
        assert closed[0].levelno == logging.WARNING
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []

    run_trio(body, timeout=50)
