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
from otpmesh._wire._frames import HELLO
from otpmesh._wire._framing import frame_header
from otpmesh._wire._handshake import dial
from tests.actors import Echo
from tests.conftest import run_trio


def _sent_20_times(frame: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Send `frame` to a running app's controller on 20 authenticated connections, each of
    which must be closed on it; then the app must still answer."""

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("e", Echo)
            rt = await runtime()
            with caplog.at_level(logging.DEBUG, logger="otpmesh"):
                for _ in range(20):
                    sock, _ = await dial(rt.node.addr, rt.node.secret)
                    sock.sendall(frame_header(len(frame)) + frame)
                    sock.settimeout(30)
                    assert await trio.to_thread.run_sync(sock.recv, 1) == b""  # closed
                    sock.close()
            assert await echo[0].echo("still here") == "still here"

    run_trio(body, timeout=50)


def _logged_once(caplog: pytest.LogCaptureFixture, about: str) -> str:
    """The one line above DEBUG that mentions `about` (20 in all, the others at DEBUG)."""
    every = [r for r in caplog.records if about in r.getMessage()]
    shown = [r for r in every if r.levelno > logging.DEBUG]
    assert len(shown) == 1, [r.getMessage() for r in shown]
    assert shown[0].levelno == logging.WARNING
    assert len(every) == 20
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    return shown[0].getMessage()


@pytest.mark.timeout(60)
def test_forged_hellos_are_refused_and_logged_once_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hello = msgpack.packb([HELLO, {"proc": "p999", "addr": "nowhere", "pid": 1}])
    _sent_20_times(hello, caplog)
    line = _logged_once(caplog, "worker HELLO")
    assert "no worker process of this controller" in line and "p999" in line


@pytest.mark.timeout(60)
def test_broken_frames_from_a_peer_are_logged_once_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _sent_20_times(b"\xc1" * 8, caplog)  # 0xc1 is never valid msgpack
    assert "malformed frame" in _logged_once(caplog, "closed it")
