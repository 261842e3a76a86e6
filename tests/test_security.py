"""Only the app itself can talk to its actors (docs/security.md): every connection proves it
knows the app's secret, Unix sockets check the peer's user, control operations come only from a
process's parent, and no path on the wire is ever imported. Real processes, real sockets."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

import otpmesh
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._wire import _secret
from otpmesh._wire._handshake import HANDSHAKE
from otpmesh._wire._refusals import SUMMARY_EVERY, RefusalLog
from tests.actors import Echo, Intruder
from tests.conftest import other_user, run_trio

# What an attacker with plain Python sends: the handshake, then a call and a shutdown, as if
# the socket accepted any peer. Prints every byte it got back, as hex, then how it ended.
ATTACK = textwrap.dedent(
    r"""
    import socket, struct, sys
    addr = bytes.fromhex(sys.argv[1]).decode()
    call = bytes.fromhex(sys.argv[2])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(addr)
    got = b""
    def receive(n):
        global got
        while n > 0:
            chunk = sock.recv(n)
            if not chunk:
                return False
            got += chunk
            n -= len(chunk)
        return True
    try:
        sock.sendall(b"OTPMESH\x00\x00\x01\x00\x00")
        if receive(12 + 32):  # the handshake, then the acceptor's nonce
            sock.sendall(b"\x00" * 64)  # a nonce and a proof it cannot compute
            sock.sendall(struct.pack(">I", len(call)) + call)
            receive(1 << 20)
        print(got.hex() or "-", "closed")
    except (ConnectionResetError, BrokenPipeError):
        print(got.hex() or "-", "reset")
    except socket.timeout:
        print(got.hex() or "-", "timeout")
    """
)


def _call_frame(actor: str, method: str) -> bytes:
    return otpmesh._wire._codec.pack([0, 1, actor, method, [], {}])


def _attack(addr: str, frame: bytes, user: str | None = None) -> tuple[bytes, str]:
    """Run ATTACK in a fresh process (as `user`, when given); what it got back and how it ended."""
    # The system's Python: another user cannot run one under root's home (pyenv, a venv).
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    done = subprocess.run(
        [python, "-c", ATTACK, addr.encode().hex(), frame.hex()],
        capture_output=True,
        text=True,
        timeout=30,
        user=user,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    got, how = done.stdout.split()
    return bytes.fromhex(got.strip("-")), how


def _spawn_request(cls: str) -> dict[str, object]:
    """A spawn_actor request for one actor `planted/0` of class `cls` (an import path)."""
    return {
        "id": "planted/0",
        "incarnation": 1,
        "cls": cls,
        "name": "planted",
        "rank": 0,
        "coords": {},
        "shape": {},
        "args": [],
        "kwargs": {},
    }


@pytest.mark.parametrize("who", ["same user without the secret", "another Unix user"])
def test_a_peer_that_cannot_prove_itself_gets_nothing_and_the_app_keeps_answering(
    who: str, caplog: pytest.LogCaptureFixture
) -> None:
    user = other_user() if who == "another Unix user" else None

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            echo = await procs.spawn("vault", Echo, "the secret")
            worker = procs._procs[0].addr
            controller = (await runtime()).node.addr
            with caplog.at_level(logging.WARNING, logger="otpmesh.node"):
                for addr in (worker, controller):
                    got, how = await trio.to_thread.run_sync(
                        _attack, addr, _call_frame("vault/0", "whoami"), user
                    )
                    if user is None:  # the same user: the handshake and a nonce, no more
                        assert got[: len(HANDSHAKE)] == HANDSHAKE
                        assert len(got) == len(HANDSHAKE) + _secret.NONCE_SIZE
                    else:  # another user: refused before a byte is sent
                        assert got == b""
                    assert how in ("closed", "reset")
                    got, _ = await trio.to_thread.run_sync(
                        _attack, addr, otpmesh._wire._codec.pack([4, 1, "shutdown", {}]), user
                    )
                    assert b"shutdown" not in got
            # Nothing was invoked: the actor is the same one, and answers.
            assert (await echo[0].whoami())["tag"] == "the secret"
            assert await echo[0].echo("still here") == "still here"
            refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            if user is None:
                assert any("wrong secret" in line for line in refused), refused
            else:
                assert any("not this app's uid" in line for line in refused), refused

    run_trio(body, timeout=60)


def test_control_operations_from_another_actors_connection_are_refused() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            victim = await procs.spawn("victim", Echo, "victim")
            intruders = await procs.spawn("intruder", Intruder)
            target = procs._procs[0].addr  # victim/0 lives there; intruder/1 runs elsewhere
            spawn = _spawn_request("tests.actors:Echo")
            for op, payload in [
                ("spawn_actor", spawn),
                ("stop_actor", {"id": "victim/0", "incarnation": 1}),
                ("inject", {"id": "victim/0", "kind": "crash", "reason": "x"}),
                ("shutdown", {}),
                ("peer_dying", {"addr": procs._procs[1].addr, "reason": "lies"}),  # cut it off
            ]:
                answer = await intruders[1].node_op(target, op, payload)
                assert answer.startswith("refused: ") and "only this process's parent" in answer
            assert await victim[0].echo("unharmed") == "unharmed"
            assert (await victim[0].whoami())["pid"] == procs._procs[0].pid
            # The same request from the parent (the controller) is obeyed: the check is real.
            rt = await runtime()
            proc = procs._procs[0]
            assert await rt.node.sys_call(proc.conn, "spawn_actor", spawn, "planted/0") == "started"

    run_trio(body, timeout=60)


MARKER_MAIN = """
import pathlib
pathlib.Path({marker!r}).write_text("executed")

import otpmesh

class Planted(otpmesh.Actor):
    pass
"""


def test_a_main_path_in_a_message_is_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "evil_main.py"
    evil.write_text(MARKER_MAIN.format(marker=str(marker)))

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            rt = await runtime()
            proc = procs._procs[0]
            # A main path in the message: what an old controller sent, and an attacker would.
            request = dict(_spawn_request("__main__:Planted"), main=str(evil))
            # Even from the parent, the path in the message is ignored: the worker imports
            # only the main file its parent named when it forked it (this test's runner).
            with pytest.raises(otpmesh.ActorError, match=r"Planted|__main__"):
                await rt.node.sys_call(proc.conn, "spawn_actor", request, "planted/0")
            echo = await procs.spawn("e", Echo)  # the worker is unharmed
            assert (await echo.echo(1)).values() == [1]

    run_trio(body, timeout=60)
    assert not marker.exists()


def test_refusals_are_logged_once_per_peer_then_folded_into_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RefusalLog(logging.getLogger("otpmesh.test"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="otpmesh.test"):
        for port in range(1000, 1100):  # one host, many source ports: one peer
            refusals.refused(f"10.0.0.7:{port}", "wrong secret")
        refusals.refused("pid 77 (uid 1001)", "peer runs as uid 1001")
        now[0] = SUMMARY_EVERY + 1
        refusals.refused("10.0.0.7:2000", "wrong secret")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 10.0.0.7:1000: wrong secret",
        "refused pid 77 (uid 1001): peer runs as uid 1001",
        "refused 10.0.0.7:2000: wrong secret (and 99 more refusals since 61 s ago)",
    ]
    assert refusals.counts == {"10.0.0.7": 101, "uid 1001": 1}
