"""Handles are capabilities: a forged, altered or stale tensor-channel handle reads and writes
nothing, and fails with an RDMAError that says why; junk fails to decode at all.

The victim is a separate process holding a secret in a bytearray at a known, live address: the
attack the old handle allowed was to name its pid and address and let a worker copy them."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import pytest
import torch

import otpmesh
from otpmesh._core._errors import ProtocolError
from otpmesh._node._hostid import boot_id, pid_namespace
from otpmesh._node._node import current_node
from otpmesh._wire import _codec
from otpmesh.rdma import RDMABuffer, RDMAError
from otpmesh.rdma._backend import Region
from otpmesh.rdma._handle import Handle, new_token
from otpmesh.rdma._shm import _copy
from tests.actors import TensorOwner
from tests.conftest import run_trio

SECRET = b"victim-secret-" * 300  # 4200 bytes


class Prober(otpmesh.Actor):
    """Tries a handle it was given and reports what happened to its own memory."""

    @otpmesh.endpoint
    async def read(self, buf: RDMABuffer, numel: int) -> dict[str, Any]:
        dst = torch.zeros(numel, dtype=torch.uint8)
        try:
            await buf.read_into(dst, timeout=20)
        except RDMAError as exc:
            return {"error": str(exc), "touched": bool(dst.any())}
        return {"error": None, "touched": bool(dst.any()), "backend": buf.backend}

    @otpmesh.endpoint
    async def write(self, buf: RDMABuffer, numel: int) -> str | None:
        try:
            await buf.write_from(torch.full((numel,), 0x41, dtype=torch.uint8), timeout=20)
        except RDMAError as exc:
            return str(exc)
        return None

    @otpmesh.endpoint
    def drop(self, buf: RDMABuffer) -> None:
        buf.drop()

    @otpmesh.endpoint
    def numel(self, tensor: Any) -> int:
        return int(tensor.numel())


@dataclass
class Victim:
    proc: subprocess.Popen[str]
    pid: int
    address: int

    def content_digest(self) -> str:
        """Ask the victim for a digest of its secret as it is now (then it exits)."""
        out, _ = self.proc.communicate("check\n", timeout=20)
        return out.strip()


_VICTIM = f"""
import ctypes, hashlib, os, sys
secret = bytearray({SECRET!r})
try:  # let any same-user process read it even where Yama restricts ptrace to ancestors
    ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)
except Exception:
    pass
address = ctypes.addressof(ctypes.c_char.from_buffer(secret))
print(os.getpid(), address, flush=True)
sys.stdin.readline()
print(hashlib.sha256(secret).hexdigest(), flush=True)
"""


@pytest.fixture
def victim() -> Iterator[Victim]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _VICTIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid, address = map(int, proc.stdout.readline().split())
        # The address is live: this process (the victim's parent) can read the secret there.
        seen = bytearray(len(SECRET))
        local = ctypes.addressof(ctypes.c_char.from_buffer(seen))
        _copy(pid, Region(local, len(seen)), address, write=False)
        assert bytes(seen) == SECRET
        yield Victim(proc, pid, address)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(autouse=True)
def _shm_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    os.environ.pop("OTPMESH_PRELOAD", None)  # these workers do touch tensors
    monkeypatch.setenv("OTPMESH_RDMA_BACKENDS", "shm,tcp")
    # The shm backend's own checks, between workers that may read each other (sandboxed,
    # two workers use tcp: tests/rdma/test_shm_confined.py).
    monkeypatch.setenv("OTPMESH_SANDBOX", "0")


def _forged(**fields: Any) -> Handle:
    base = Handle(
        buffer=1,
        token=new_token(),
        owner="@nobody",
        nbytes=len(SECRET),
        dtype="uint8",
        shape=(len(SECRET),),
        backends=("shm",),
    )
    return replace(base, **fields)


def _wire(handle: Handle, **changes: Any) -> dict[str, Any]:
    return {**handle.to_wire(), **changes}


# ---------------------------------------------------------------- junk never decodes

_GOOD = _wire(_forged())


@pytest.mark.parametrize(
    ("junk", "message"),
    [
        ([1, 2, 3], r"field 'the handle' is \[1, 2, 3\], expected a map"),
        (
            {"id": 1, "pid": 4242, "entries": {"shm": {"address": 1 << 40}}},
            r"unexpected field 'entries'",
        ),
        ({**_GOOD, "pid": 4242}, r"unexpected field 'pid'"),
        ({k: v for k, v in _GOOD.items() if k != "token"}, r"field 'token' is missing"),
        ({**_GOOD, "token": None}, r"field 'token' is None, expected 32 lowercase hex"),
        ({**_GOOD, "token": "abc"}, r"field 'token' is 'abc', expected 32 lowercase hex"),
        ({**_GOOD, "id": "1"}, r"field 'id' is '1', expected an integer from 1"),
        ({**_GOOD, "id": True}, r"field 'id' is True, expected an integer from 1"),
        ({**_GOOD, "id": 0}, r"field 'id' is 0, expected an integer from 1"),
        ({**_GOOD, "nbytes": -1}, r"field 'nbytes' is -1, expected an integer from 0"),
        ({**_GOOD, "owner": 7}, r"field 'owner' is 7, expected a node address"),
        ({**_GOOD, "shape": [2, "x"]}, r"field 'shape' is \[2, 'x'\], expected a list of sizes"),
        ({**_GOOD, "shape": [-1]}, r"field 'shape' is \[-1\], expected a list of sizes"),
        ({**_GOOD, "dtype": 3}, r"field 'dtype' is 3, expected a dtype name"),
        ({**_GOOD, "backends": {"shm": {}}}, r"field 'backends' is \{'shm': \{\}\}"),
    ],
)
def test_a_junk_handle_fails_to_decode_with_a_clear_error(junk: Any, message: str) -> None:
    with pytest.raises(RDMAError, match="malformed RDMABuffer handle: " + message):
        RDMABuffer._from_wire(junk)
    # On the wire the frame is refused whole: the error names the handle's fault.
    frame = _codec.pack([msgpack.ExtType(_codec.EXT_RDMA_BUFFER, msgpack.packb(junk))])
    with pytest.raises(ProtocolError, match=r"RDMAError: malformed RDMABuffer handle: "):
        _codec.unpack(frame)


def test_a_genuine_handle_round_trips_through_the_codec() -> None:
    handle = _forged()
    decoded = _codec.unpack(_codec.pack([RDMABuffer._of(handle)]))[0]
    assert decoded._handle == handle
    assert "pid" not in handle.to_wire() and "entries" not in handle.to_wire()


# ---------------------------------------------------------------- forged against a real owner


async def _owner_and_prober() -> tuple[otpmesh.ProcMesh, otpmesh.ActorRef, otpmesh.ActorRef]:
    procs = await otpmesh.proc_mesh(procs=2)
    owners = await procs.spawn("owner", TensorOwner)
    probers = await procs.spawn("prober", Prober)
    return procs, owners[0], probers[1]  # owner and prober in different processes


def test_a_wrong_token_unknown_id_or_altered_size_reads_and_writes_nothing() -> None:
    numel = 4096

    async def body() -> None:
        procs, owner, prober = await _owner_and_prober()
        async with procs:
            genuine = await owner.register(1, numel, "uint8")  # arange: 0, 1, 2, ... (mod 256)
            expected = torch.arange(numel, dtype=torch.uint8)
            h = genuine._handle
            cases = [
                (replace(h, token=new_token()), "the handle's token is not the one its owner"),
                (replace(h, buffer=999), "buffer 999 was never registered by its owner"),
                (
                    replace(h, nbytes=2 * numel, shape=(2 * numel,)),
                    r"the handle says it holds uint8\[8192\] \(8192 bytes\), its owner "
                    r"registered uint8\[4096\] \(4096 bytes\); the handle was altered",
                ),
            ]
            for forged, message in cases:
                got = await prober.read(RDMABuffer._of(forged), forged.nbytes)
                assert got["error"] is not None, got
                assert not got["touched"]
                assert re.search(message, got["error"]), got["error"]
                assert "nothing was read or written" in got["error"]
                error = await prober.write(RDMABuffer._of(forged), forged.nbytes)
                assert error is not None and "nothing was read or written" in error
                assert torch.equal(await owner.value(1), expected)
            # A drop with the wrong token is refused too: the buffer stays registered.
            await prober.drop(RDMABuffer._of(cases[0][0]))
            assert await owner.registered() == 1
            # The genuine handle still works, both ways.
            got = await prober.read(genuine, numel)
            assert got["error"] is None and got["backend"] == "shm"
            assert await prober.write(genuine, numel) is None
            assert torch.equal(await owner.value(1), torch.full((numel,), 0x41, dtype=torch.uint8))

    run_trio(body, timeout=120)


def test_an_owner_naming_another_process_is_refused_and_the_victim_is_untouched(
    victim: Victim,
) -> None:
    """The controller plays a lying owner: its answer to the pin names the victim's pid and the
    live address of its secret. The prober checks who answered (SO_PEERCRED) and refuses."""
    n = len(SECRET)

    async def lying_owner(conn: Any, request: dict[str, Any]) -> Any:
        if request.get("op") != "pin":
            return True
        return {
            "pid": victim.pid,
            "boot_id": boot_id(),
            "pidns": pid_namespace(),
            "nbytes": n,
            "dtype": "uint8",
            "shape": [n],
            "entries": {"shm": {"address": victim.address, "nbytes": n}},
        }

    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            prober = (await procs.spawn("prober", Prober))[0]
            node = current_node()
            assert node is not None
            node.sys_handlers["rdma"] = lying_owner
            forged = RDMABuffer._of(_forged(owner=node.addr))
            refusal = (
                rf"answered that the buffer lives in pid {victim.pid}, but that connection "
                rf"belongs to pid {os.getpid()}; refusing to read or write another process's"
            )
            got = await prober.read(forged, n)
            assert got["error"] is not None and not got["touched"]
            assert re.search(refusal, got["error"]), got["error"]
            error = await prober.write(forged, n)
            assert error is not None and "refusing to read or write" in error
            # The same handle as a large tensor in an ordinary call: refused before delivery.
            ext = msgpack.ExtType(
                _codec.EXT_CHANNEL_TENSOR, msgpack.packb(forged._handle.to_wire())
            )
            with pytest.raises(otpmesh.ActorError, match=r"could not be fetched: .*refusing"):
                await prober.numel(ext)

    run_trio(body, timeout=120)
    assert victim.content_digest() == hashlib.sha256(SECRET).hexdigest()


def test_a_forged_channel_tensor_is_refused_before_anything_is_allocated_or_read() -> None:
    async def body() -> None:
        procs, owner, prober = await _owner_and_prober()
        async with procs:
            genuine = (await owner.register(1, 1 << 20, "uint8"))._handle
            # Names a genuine buffer, a made-up token and a 1 TiB shape: the owner refuses the
            # token before the receiver allocates anything.
            huge = replace(genuine, token=new_token(), nbytes=1 << 40, shape=(1 << 40,))
            junk = {"id": genuine.buffer, "owner": genuine.owner}
            cases = [
                (huge.to_wire(), "the handle's token is not the one its owner issued"),
                (junk, "malformed RDMABuffer handle: field 'token' is missing"),
                (
                    _wire(genuine, dtype="no_such_dtype"),
                    r"names no torch dtype and shape: 'no_such_dtype'",
                ),
            ]
            for data, message in cases:
                ext = msgpack.ExtType(_codec.EXT_CHANNEL_TENSOR, msgpack.packb(data))
                with pytest.raises(
                    otpmesh.ActorError, match=rf"RDMAError: .*could not be fetched: .*{message}"
                ):
                    await prober.numel(ext)
            assert torch.equal(
                await owner.value(1), torch.arange(1 << 20, dtype=torch.uint8)
            )  # untouched
            assert await prober.numel(torch.zeros(1 << 20, dtype=torch.uint8)) == 1 << 20

    run_trio(body, timeout=120)
