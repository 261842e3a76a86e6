"""A codec no input can crash: hostile bytes meet every decoder in a process that must survive.

Decoding once recursed through msgpack's C unpacker for each nested extension value, until the
C stack ran out (SIGSEGV). A crash cannot be caught in-process, so hostile payloads go to a
decoder process (``_DECODER``, one per test module, fed many payloads over a pipe) and the tests
check that it answers each one and never dies. Values the encoder accepts are bounded by the
same limit, so they are checked in-process.

A decode's work must also be bounded by its bytes: a 27-byte zero-element tensor of shape
``[2**31, 0]`` as a crash's payload once made a decoder walk 2**31 rows (OOM-killed at 23 GB).
The decoder process runs under an address-space cap, so such a decode fails the test (its
answer says it met the cap) instead of eating the machine.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh._wire import _codec
from otpmesh._wire._codec import MAX_NESTING, MAX_TENSOR_DIMS, pack, unpack
from otpmesh._wire._frames import decode_message
from otpmesh._wire._framing import MAX_FRAME_SIZE
from otpmesh._wire._handshake import HANDSHAKE
from tests.actors import Echo
from tests.conftest import reset_peak_rss, run_trio, vm_kib

# Reads records (kind: 1 byte, length: u32, payload) from stdin and answers each with one line:
# "ok", or "refused <error type>" for a clean ProtocolError/EncodeError, or "capped <error>"
# when the decode ran into the address-space cap (a ProtocolError whose cause was out of
# memory is no clean refusal: a process without the cap would have been OOM-killed). Any other
# exception ends it with a traceback on stderr; a crash ends it by a signal.
#
# The cap (RLIMIT_AS) is set above what the process maps once it has imported everything a
# decode may import (torch maps much address space it never touches): a decode that allocates
# past a small multiple of its payload hits it, and no decode can eat the machine.
_DECODER = r"""
import os, resource, struct, sys
import numpy, torch
import otpmesh._node._mesh, otpmesh.rdma._buffer
from otpmesh._wire import _codec, _frames, _framing, _handshake
from otpmesh._core._errors import EncodeError, ProtocolError

def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

CAP = (vm_kib("VmSize") << 10) + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

def out_of_memory(exc):
    while exc is not None:
        if isinstance(exc, MemoryError) or "bad_alloc" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False

def feed(data):
    decoder = _framing.FrameDecoder(max_frame_size=1 << 20)
    for frame in decoder.feed(data):
        _frames.decode_message(frame)

def lazy_imports(data):
    print(" ".join(sorted(m for m in sys.modules if m.startswith("torch.") and
                          m.split(".")[1] in ("_dynamo", "_inductor", "_export", "onnx"))))

DECODERS = {
    b"u": _codec.unpack,
    b"m": _frames.decode_message,
    b"f": feed,
    b"h": _handshake.check_handshake,
}
stdin = sys.stdin.buffer
while True:
    head = stdin.read(5)
    if len(head) < 5:
        break
    kind, (size,) = head[:1], struct.unpack(">I", head[1:])
    data = stdin.read(size)
    if kind == b"i":
        lazy_imports(data)
        sys.stdout.flush()
        continue
    try:
        DECODERS[kind](data)
        answer = "ok"
    except (ProtocolError, EncodeError) as exc:
        answer = "refused " + type(exc).__name__
        if out_of_memory(exc):
            answer = "capped " + repr(exc)[:200]
    except MemoryError as exc:
        answer = "capped " + repr(exc)[:200]
    print(answer, flush=True)
"""
#: Address space a decoder process may map beyond its baseline: many times the payloads the
#: tests send (at most a few MiB), far below what a decode that walks 2**31 rows needs.
DECODER_CAP = 1 << 30


class DecoderProcess:
    """A child process that decodes what it is sent; it must answer every payload and live."""

    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # threads' arenas map address space
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DECODER, str(DECODER_CAP)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )
        self._pending = b""

    def ask(self, kind: bytes, data: bytes, timeout: float = 30.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(kind + struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._died(data)
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"decoder process hung on {data[:80]!r}")
            chunk = os.read(fd, 4096)
            if not chunk:
                self._died(data)
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def decode(self, kind: bytes, data: bytes) -> str:
        answer = self.ask(kind, data)
        assert answer in ("ok", "refused ProtocolError"), answer
        return answer

    def _died(self, data: bytes) -> None:
        code = self.proc.wait(timeout=10)
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self.stderr.seek(0)
        tail = self.stderr.read()[-3000:].decode(errors="replace")
        raise AssertionError(f"decoder process died ({how}) on {data[:80]!r}:\n{tail}")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        self.stderr.close()


@pytest.fixture(scope="module")
def decoder() -> Iterator[DecoderProcess]:
    proc = DecoderProcess()
    yield proc
    proc.close()


# ---------------------------------------------------------------- building payloads by hand

_TUPLE_OF_TWO = msgpack.ExtType(_codec.EXT_TUPLE, msgpack.packb([1, 2]))


def _tensor_ext(dtype: Any, shape: Any, body: bytes, hlen: int | None = None) -> bytes:
    header = msgpack.packb([dtype, shape])
    size = len(header) if hlen is None else hlen
    return struct.pack(">H", size) + header + body


def _nested(codes: list[int], leaf: Any = 0) -> bytes:
    """A payload whose extension values nest as `codes` say, outermost first, bypassing the
    encoder: each level's payload is a one-item array holding the next level."""
    inner = msgpack.packb(leaf)
    for code in reversed(codes):
        inner = msgpack.packb(msgpack.ExtType(code, b"\x91" + inner))
    return inner


def _tuples(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = (value,)
    return value


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


EXT_CODES = [
    _codec.EXT_TENSOR,
    _codec.EXT_ACTOR_REF,
    _codec.EXT_ACTOR_MESH,
    _codec.EXT_TUPLE,
    _codec.EXT_VALUE_MESH,
    _codec.EXT_ACTOR_CRASH,
    _codec.EXT_PROCESS_EXIT,
    _codec.EXT_RDMA_BUFFER,
    _codec.EXT_CHANNEL_TENSOR,
    _codec.EXT_ARRAY,
    _codec.EXT_CHANNEL_BUFFER,
    _codec.EXT_HUNG,
    _codec.EXT_PORT,
]
# Every extension whose payload is msgpack (so a nested value inside it is decoded too).
CONTAINER_CODES = [c for c in EXT_CODES if c not in (_codec.EXT_TENSOR, _codec.EXT_ARRAY)]

_SMALL_TENSOR = msgpack.ExtType(_codec.EXT_TENSOR, _tensor_ext("float32", [2], b"\x00" * 8))


# ---------------------------------------------------------------- nesting: decoding


def test_300_nested_tuples_built_by_hand_are_a_protocol_error_not_a_crash(
    decoder: DecoderProcess,
) -> None:
    payload = _nested([_codec.EXT_TUPLE] * 300)
    for kind, data in [
        (b"u", payload),
        (b"m", b"\x93\x02\x01" + payload),  # an OK frame with it as the value
        (b"f", _frame(b"\x93\x02\x01" + payload)),
    ]:
        assert decoder.decode(kind, data) == "refused ProtocolError"
    assert decoder.decode(b"m", b"\x93\x02\x01" + _nested([_codec.EXT_TUPLE] * 3)) == "ok"


@pytest.mark.parametrize("code", CONTAINER_CODES)
def test_every_extension_nested_300_deep_is_a_protocol_error(
    decoder: DecoderProcess, code: int
) -> None:
    assert decoder.decode(b"u", _nested([code] * 300)) == "refused ProtocolError"
    assert decoder.decode(b"u", _nested([code, _codec.EXT_TUPLE] * 150)) == "refused ProtocolError"


def test_tuples_decode_up_to_the_limit_and_not_one_level_more() -> None:
    # Safe in-process: the limit itself is what bounds the recursion.
    assert unpack(_nested([_codec.EXT_TUPLE] * MAX_NESTING)) == _tuples(MAX_NESTING)
    with pytest.raises(otpmesh.ProtocolError, match=f"nested more than {MAX_NESTING} levels"):
        unpack(_nested([_codec.EXT_TUPLE] * (MAX_NESTING + 1)))
    with pytest.raises(otpmesh.ProtocolError, match=f"nested more than {MAX_NESTING} levels"):
        unpack(_nested([_codec.EXT_TUPLE] * MAX_NESTING, leaf=_SMALL_TENSOR))


def test_plain_arrays_and_maps_nested_past_msgpacks_limit_are_a_protocol_error() -> None:
    # msgpack's C unpacker walks them with its own fixed stack (no recursion): 1024 levels.
    assert unpack(b"\x91" * 1024 + b"\x00") is not None
    for opener in (b"\x91", b"\x81\x00"):
        with pytest.raises(otpmesh.ProtocolError, match="nested deeper than msgpack's limit"):
            unpack(opener * 1_000_000 + b"\x00")


def test_unpack_hands_the_channel_tensors_it_met_back_to_its_caller() -> None:
    channel = msgpack.ExtType(_codec.EXT_CHANNEL_TENSOR, msgpack.packb({"id": 1}))
    value, pending = _codec.unpack_pending(
        msgpack.packb([channel, msgpack.ExtType(_codec.EXT_TUPLE, msgpack.packb([channel, 2]))])
    )
    assert [p.handle for p in pending] == [{"id": 1}, {"id": 1}]
    assert value[0] is pending[0]
    # A frame that fails to decode hands nothing to anyone (there is no state to leave behind).
    with pytest.raises(otpmesh.ProtocolError, match="unknown extension type 77"):
        _codec.unpack_pending(msgpack.packb([channel, msgpack.ExtType(77, b"")]))


@st.composite
def nested_payloads(draw: st.DrawFn) -> bytes:
    """Extension values nested up to 300 deep, any codes, with a leaf that may be a tensor."""
    depth = draw(st.one_of(st.integers(0, MAX_NESTING + 2), st.integers(0, 300)))
    codes = draw(st.lists(st.sampled_from(CONTAINER_CODES), min_size=depth, max_size=depth))
    leaf = draw(st.sampled_from([0, _SMALL_TENSOR, _TUPLE_OF_TWO, [b"\x00" * 3], {"k": None}]))
    return _nested(codes, leaf)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_payloads())
def test_nested_extensions_of_every_kind_never_crash_a_decoder(
    decoder: DecoderProcess, payload: bytes
) -> None:
    decoder.decode(b"u", payload)
    decoder.decode(b"m", b"\x93\x02\x01" + payload)


def _garbage_exts() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.integers(-(2**63), 2**64 - 1),
        st.text(max_size=8),
        st.binary(max_size=16),
        st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=24)),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.text(max_size=4), inner, max_size=3),
            st.builds(
                lambda code, item: msgpack.ExtType(code, msgpack.packb(item)),
                st.sampled_from([*EXT_CODES, 0, 10, 127]),
                inner,
            ),
        ),
        max_leaves=30,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _garbage_exts().map(msgpack.packb)))
def test_garbage_never_crashes_any_decoder(decoder: DecoderProcess, data: bytes) -> None:
    decoder.decode(b"u", data)
    decoder.decode(b"m", data)
    decoder.decode(b"f", _frame(data) + data[:7])
    decoder.decode(b"f", data)
    decoder.decode(b"h", (HANDSHAKE[:8] + data)[:12].ljust(12, b"\x00"))
    decoder.decode(b"h", data[:12].ljust(12, b"\x00"))


# ---------------------------------------------------------------- nesting: encoding


def test_tuples_encode_up_to_the_limit_and_refuse_one_level_more() -> None:
    assert unpack(pack(_tuples(MAX_NESTING))) == _tuples(MAX_NESTING)
    for depth in (MAX_NESTING + 1, 300, 5000):
        with pytest.raises(otpmesh.EncodeError, match=f"more than {MAX_NESTING} levels deep"):
            pack(_tuples(depth))


def test_tensors_and_value_meshes_count_as_levels_when_encoding() -> None:
    inside = _tuples(MAX_NESTING - 1, torch.arange(3))
    assert torch.equal(_tuples_leaf(unpack(pack(inside)), MAX_NESTING - 1), torch.arange(3))
    with pytest.raises(otpmesh.EncodeError, match="levels deep"):
        pack(_tuples(MAX_NESTING, torch.arange(3)))
    mesh: Any = 0
    for _ in range(MAX_NESTING):
        mesh = otpmesh.ValueMesh({}, [mesh])
    assert _same(unpack(pack(mesh)), mesh)
    with pytest.raises(otpmesh.EncodeError, match="levels deep"):
        pack(otpmesh.ValueMesh({}, [mesh]))
    # A value mesh's shape pairs are tuples: one level below the mesh.
    with pytest.raises(otpmesh.EncodeError, match="levels deep"):
        pack(_tuples(MAX_NESTING - 1, otpmesh.ValueMesh({"x": 1}, [0])))


def _tuples_leaf(value: Any, depth: int) -> Any:
    for _ in range(depth):
        (value,) = value
    return value


def test_msgpacks_own_limits_while_encoding_are_encode_errors() -> None:
    deep: Any = 0
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(otpmesh.EncodeError, match="recursion limit exceeded"):
        pack(deep)
    with pytest.raises(otpmesh.EncodeError, match="recursion limit exceeded"):
        pack((deep,))


def test_pythons_recursion_limit_while_encoding_is_an_encode_error() -> None:
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 12)  # room to start packing, not for MAX_NESTING levels
    try:
        pack(_tuples(MAX_NESTING))
    except Exception as exc:
        error: Exception | None = exc
    else:
        error = None
    finally:
        sys.setrecursionlimit(old)
    assert isinstance(error, otpmesh.EncodeError), repr(error)
    assert "nested too deeply" in str(error)


@st.composite
def nested_values(draw: st.DrawFn) -> tuple[Any, int]:
    """A value of tuples, lists, dicts, value meshes and tensors, and its extension depth."""
    value: Any = draw(st.sampled_from([0, "s", b"b", None, torch.ones(2)]))
    levels = 1 if isinstance(value, torch.Tensor) else 0
    for wrap in draw(st.lists(st.sampled_from(["tuple", "list", "dict", "mesh"]), max_size=40)):
        if wrap == "tuple":
            value, levels = (value, 1), levels + 1
        elif wrap == "list":
            value = [value]
        elif wrap == "dict":
            value = {"k": value}
        else:
            value, levels = otpmesh.ValueMesh({}, [value]), levels + 1
    return value, levels


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, otpmesh.ValueMesh):
        return isinstance(b, otpmesh.ValueMesh) and _same(a.values(), b.values())
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=150, deadline=None)
@given(nested_values())
def test_encoding_refuses_exactly_the_values_nested_past_the_limit(
    decoder: DecoderProcess, case: tuple[Any, int]
) -> None:
    value, levels = case
    if levels > MAX_NESTING:
        with pytest.raises(otpmesh.EncodeError, match="levels deep"):
            pack(value)
        return
    data = pack(value)
    assert decoder.decode(b"u", data) == "ok"
    assert _same(unpack(data), value)


# ---------------------------------------------------------------- tensor headers


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\x00", "1-byte tensor payload has no header"),
        (_tensor_ext("float32", [1], b"\x00" * 4, hlen=200), "header of 200 bytes overruns"),
        (struct.pack(">H", 1) + b"\x05", r"not \[dtype name, shape\]: 5"),
        (_tensor_ext("float32", 3, b""), r"not \[dtype name, shape\]"),
        (_tensor_ext("__class__", [], b""), "unknown tensor dtype '__class__'"),
        (_tensor_ext("load", [], b""), "unknown tensor dtype 'load'"),
        (_tensor_ext("_dynamo", [], b""), "unknown tensor dtype '_dynamo'"),
        (_tensor_ext("has_cuda", [], b""), "unknown tensor dtype 'has_cuda'"),
        (_tensor_ext(7, [], b""), "unknown tensor dtype 7"),
        (_tensor_ext("float32", [-1, -4], b"\x00" * 16), r"shape \[-1, -4\] has a dim"),
        (_tensor_ext("float32", [True], b"\x00" * 4), r"shape \[True\] has a dim"),
        (_tensor_ext("float32", [1.0], b"\x00" * 4), r"shape \[1.0\] has a dim"),
        (_tensor_ext("uint8", [1] * 65, b"\x00"), f"65 dims \\(at most {MAX_TENSOR_DIMS}\\)"),
        (_tensor_ext("float32", [3], b"\x00" * 11), "needs 12 bytes, frame has 11"),
        (_tensor_ext("int64", [2**62, 2**62], b""), "needs .* bytes, frame has 0"),
    ],
)
def test_tensor_headers_are_validated(payload: bytes, match: str) -> None:
    with pytest.raises(otpmesh.ProtocolError, match=match):
        unpack(msgpack.packb(msgpack.ExtType(_codec.EXT_TENSOR, payload)))


def test_a_dtype_name_never_reaches_torchs_lazy_imports(decoder: DecoderProcess) -> None:
    assert decoder.decode(b"u", msgpack.packb(_SMALL_TENSOR)) == "ok"  # torch is imported
    imported = decoder.ask(b"i", b"")
    for name in ("_dynamo", "_inductor", "_export", "onnx", "has_cuda"):
        payload = msgpack.packb(msgpack.ExtType(_codec.EXT_TENSOR, _tensor_ext(name, [], b"")))
        assert decoder.decode(b"u", payload) == "refused ProtocolError"
    assert decoder.ask(b"i", b"") == imported
    assert "torch._dynamo" not in imported.split()


def test_every_torch_dtype_decodes_or_is_refused_cleanly(decoder: DecoderProcess) -> None:
    names = sorted(n for n, v in vars(torch).items() if isinstance(v, torch.dtype))
    for name in names:
        size = vars(torch)[name].itemsize
        for shape in ([], [0], [3], [2, 0, 2]):
            numel = 1
            for dim in shape:
                numel *= dim
            ext = msgpack.ExtType(
                _codec.EXT_TENSOR, _tensor_ext(name, shape, b"\x01" * (numel * size))
            )
            decoder.decode(b"u", msgpack.packb(ext))


# ---------------------------------------------------------------- sizes, over real processes


@pytest.mark.timeout(120)
def test_too_deep_arguments_fail_in_the_caller_and_the_actor_lives() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=1) as procs:
            mesh = await procs.spawn("w", Echo)
            actor = mesh[0]
            with pytest.raises(otpmesh.EncodeError, match=f"more than {MAX_NESTING} levels"):
                await actor.echo(_tuples(300))
            assert await actor.echo(_tuples(MAX_NESTING)) == _tuples(MAX_NESTING)
            assert await actor.echo("still here") == "still here"

    run_trio(body, timeout=100)


@pytest.mark.whole_machine  # 2 GiB, and peak RSS
def test_too_big_bytes_without_a_tensor_channel_fail_fast_and_are_never_copied() -> None:
    """A node's messages take large bytes over its tensor channel; without one (a bare pack)
    more than a frame's worth is refused before anything is copied."""
    big = b"\x00" * (2 << 30)  # 2 GiB, twice the frame limit
    for args, kwargs in [((big,), {}), ((), {"x": memoryview(big)}), (([big],), {})]:
        reset_peak_rss()
        before = vm_kib("VmHWM")
        with pytest.raises(otpmesh.EncodeError) as info:
            pack(["echo", list(args), kwargs])
        assert (vm_kib("VmHWM") - before) * 1024 < 256 << 20  # never copied
        for words in (str(MAX_FRAME_SIZE), "torch tensor", "otpmesh.rdma.RDMABuffer"):
            assert words in str(info.value)


@pytest.mark.whole_machine  # 1 GiB and more
@pytest.mark.timeout(120)
def test_a_message_whose_packed_size_passes_the_quick_check_is_still_refused() -> None:
    # 33 items: more than the quick check looks at; 1.03 GiB once packed.
    chunk = b"\x00" * (32 << 20)
    with pytest.raises(otpmesh.EncodeError, match=f"of 1107296[0-9]* bytes: .* {MAX_FRAME_SIZE}"):
        pack(["echo", [[chunk] * 33], {}])


def test_a_tensor_too_big_for_a_frame_is_refused_before_it_is_copied() -> None:
    huge = torch.empty((MAX_FRAME_SIZE >> 2) + 1, dtype=torch.float32)  # pages never touched
    with pytest.raises(otpmesh.EncodeError, match=f"tensor of {MAX_FRAME_SIZE + 4} bytes inline"):
        pack(("weights", huge))


def test_error_messages_show_a_received_value_briefly() -> None:
    started = time.monotonic()
    for value in (b"x" * (64 << 20), {"k": ["y" * (64 << 20)]}, bytearray(64 << 20)):
        with pytest.raises(otpmesh.ProtocolError, match="not a message array") as info:
            decode_message(msgpack.packb(value))
        assert len(str(info.value)) < 400
    assert time.monotonic() - started < 5.0


# ---------------------------------------------------------------- work bounded by the bytes


def _empty(code: int, shape: list[int]) -> msgpack.ExtType:
    """A zero-element tensor (EXT_TENSOR) or numpy array (EXT_ARRAY) of `shape`: no bytes."""
    dtype = "float32" if code == _codec.EXT_TENSOR else "<f4"
    return msgpack.ExtType(code, _tensor_ext(dtype, shape, b""))


def _ext(code: int, payload: Any) -> bytes:
    packed: bytes = msgpack.packb(msgpack.ExtType(code, msgpack.packb(payload)))
    return packed


# Every extension whose payload is an array of fields, with a well-formed payload of each.
WELL_FORMED: dict[int, Any] = {
    _codec.EXT_ACTOR_CRASH: ["ValueError", "boom", "tb", "ep"],
    _codec.EXT_PROCESS_EXIT: [123, "killed by signal 9 (SIGKILL)"],
    _codec.EXT_HUNG: ["ep", 2.5, "killed", "stacks"],
    _codec.EXT_VALUE_MESH: [[["x", 2]], [1, 2]],
    _codec.EXT_ACTOR_REF: ["r", ["echo", ["ping", ["x", "y"], "aK"]], ["r/0", "addr", True], None],
    _codec.EXT_ACTOR_MESH: ["m", [["echo", ["x"], "a"]], [["x", 1]], [["m/0", "addr", False]], 3.0],
    _codec.EXT_CHANNEL_BUFFER: [["ndarray", "<f4", [4, 2]], {"id": 1}],
    _codec.EXT_PORT: ["\0otpmesh/1/w/0123", 3, b"\x01" * 16],
}


def test_well_formed_payloads_of_every_extension_still_decode() -> None:
    for code, payload in WELL_FORMED.items():
        assert unpack(_ext(code, payload)) is not None, code
    assert unpack(_ext(_codec.EXT_TUPLE, [1, 2])) == (1, 2)


HOSTILE_SHAPES = [[2**31, 0], [2**16 + 1, 0], [1 << 20, 1 << 20, 0], [0, 2**31, 2**31], [2**63, 0]]
ZERO_ELEMENT = [
    _empty(code, shape)
    for code in (_codec.EXT_TENSOR, _codec.EXT_ARRAY)
    for shape in HOSTILE_SHAPES
]


# Extensions whose payload is a map (a handle) or any array (a tuple): no fields to count.
OTHER_CODES = [_codec.EXT_TUPLE, _codec.EXT_CHANNEL_TENSOR, _codec.EXT_RDMA_BUFFER]


@pytest.mark.parametrize("code", [*WELL_FORMED, *OTHER_CODES])
@pytest.mark.parametrize("inner", [_codec.EXT_TENSOR, _codec.EXT_ARRAY])
def test_a_27_byte_zero_element_value_as_a_payload_is_refused_within_the_cap(
    decoder: DecoderProcess, code: int, inner: int
) -> None:
    """The frame that once made a decoder walk 2**31 rows (and get OOM-killed at 23 GB)."""
    payload = msgpack.packb(msgpack.ExtType(code, msgpack.packb(_empty(inner, [2**31, 0]))))
    assert len(payload) <= 27
    for kind, data in [
        (b"u", payload),
        (b"m", b"\x93\x02\x01" + payload),  # a reply carrying it
        (b"f", _frame(b"\x93\x02\x01" + payload)),
    ]:
        assert decoder.decode(kind, data) == "refused ProtocolError"


@pytest.mark.parametrize("value", ZERO_ELEMENT)
def test_zero_element_values_with_oversized_dims_are_refused_anywhere(
    decoder: DecoderProcess, value: msgpack.ExtType
) -> None:
    assert decoder.decode(b"u", msgpack.packb(value)) == "refused ProtocolError"
    assert decoder.decode(b"m", b"\x93\x02\x01" + msgpack.packb([value])) == "refused ProtocolError"


def test_zero_element_values_of_sane_shapes_travel_and_oversized_ones_fail_in_the_sender() -> None:
    import numpy

    for shape in ([0], [0, 3, 1024, 1024], [512, 0], [2**16, 0, 7]):
        assert unpack(pack(torch.empty(shape))).shape == tuple(shape)
        assert unpack(pack(numpy.empty(shape))).shape == tuple(shape)
    for value in (torch.empty(2**16 + 1, 0), numpy.empty((2**16 + 1, 0))):
        with pytest.raises(otpmesh.EncodeError, match=r"65537 rows before its first zero dim"):
            pack(value)


def test_exit_reasons_and_meshes_a_receiver_would_refuse_fail_in_the_sender() -> None:
    with pytest.raises(otpmesh.EncodeError, match="ActorCrash: its wire form field 1 is 5"):
        pack(otpmesh.ActorCrash("ValueError", 5))  # type: ignore[arg-type]
    with pytest.raises(otpmesh.EncodeError, match="dimension x=2 is not a size of at most 1"):
        pack(otpmesh.ValueMesh({"x": 2}, [1]))
    with pytest.raises(otpmesh.EncodeError, match="more points than its 3 values"):
        pack(otpmesh.ValueMesh({"x": 2, "y": 2}, [1, 2, 3]))


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(-(2**63), 2**64 - 1), max_size=2),
    st.sampled_from(ZERO_ELEMENT),
)


@st.composite
def malformed_payloads(draw: st.DrawFn) -> bytes:
    """An extension value that is certainly malformed: a payload of the wrong arity, a field of
    the wrong type (a zero-element value with huge dims is of the wrong type for every field),
    or a payload that is no array at all; for every extension code."""
    code = draw(st.sampled_from([*WELL_FORMED, *OTHER_CODES]))
    if code == _codec.EXT_TUPLE:  # any array is a tuple: only a non-array is malformed
        return _ext(code, draw(st.sampled_from([*ZERO_ELEMENT, 5, "s", {"k": 1}, None])))
    if code in (_codec.EXT_CHANNEL_TENSOR, _codec.EXT_RDMA_BUFFER):  # a handle map
        return _ext(code, draw(st.sampled_from([*ZERO_ELEMENT, [1, 2], "s", None])))
    good = WELL_FORMED[code]
    how = draw(st.sampled_from(["arity", "field", "not an array"]))
    if how == "arity":
        size = draw(st.integers(0, 8).filter(lambda n: n != len(good)))
        fields = draw(st.lists(_FIELD_VALUES, min_size=size, max_size=size))
    elif how == "field":
        fields = list(good)
        fields[draw(st.integers(0, len(good) - 1))] = draw(st.sampled_from(ZERO_ELEMENT))
    else:
        return _ext(code, draw(st.sampled_from([*ZERO_ELEMENT, 3, "s", {"k": [1]}])))
    return _ext(code, fields)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed_payloads())
def test_malformed_payloads_of_every_extension_are_a_protocol_error_within_the_cap(
    decoder: DecoderProcess, payload: bytes
) -> None:
    assert decoder.decode(b"u", payload) == "refused ProtocolError"
    assert decoder.decode(b"m", b"\x93\x02\x01" + payload) == "refused ProtocolError"
    assert decoder.decode(b"f", _frame(b"\x93\x02\x01" + payload)) == "refused ProtocolError"


def _mutants(rng: random.Random, seed: bytes, count: int) -> Iterator[bytes]:
    """`count` mutations of `seed`: bytes flipped, inserted or dropped, and integers swapped for
    huge ones (what makes a shape or a length large)."""
    huge = [b"\xce\x80\x00\x00\x00", b"\xcf\x00\x00\x00\x00\x80\x00\x00\x00", b"\xcd\xff\xff"]
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data) + 1)
            action = rng.randrange(4)
            if action == 0 and at < len(data):
                data[at] = rng.randrange(256)
            elif action == 1:
                data[at:at] = bytes([rng.randrange(256)])
            elif action == 2 and at < len(data):
                del data[at]
            else:
                data[at : at + 1] = rng.choice(huge)
        yield bytes(data)


def test_a_fuzzer_never_makes_a_decoder_die_or_reach_the_cap(decoder: DecoderProcess) -> None:
    rng = random.Random(22)
    seeds = [_ext(code, payload) for code, payload in WELL_FORMED.items()]
    seeds += [msgpack.packb(value) for value in ZERO_ELEMENT]
    seeds.append(msgpack.packb(_empty(_codec.EXT_TENSOR, [0, 3, 2])))
    for seed in seeds:
        for data in _mutants(rng, seed, 150):
            decoder.decode(b"u", data)  # "ok" or a ProtocolError; never a death or the cap
            decoder.decode(b"f", _frame(b"\x93\x02\x01" + data))


# A running app, in a process of its own under an address-space cap (set before the app forks
# its fork server, so its workers inherit it): a connection that proved the app's secret sends
# hostile frames to a worker and to the controller. Each closes that connection only, and says
# why; the actor keeps answering; no process grew by more than a little address space.
_APP_UNDER_CAP = r"""
import logging, os, resource, sys
import msgpack, torch, numpy, trio
import otpmesh
from otpmesh._runtime._controller_runtime import runtime
from otpmesh._wire._framing import frame_header
from otpmesh._wire._handshake import dial
from tests.actors import Echo

def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

# Every refusal is logged at DEBUG (only the first per peer at WARNING): each one is checked.
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
cap = (vm_kib("self", "VmSize") << 10) + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
frames = [bytes.fromhex(h) for h in sys.argv[2:]]

async def main():
    async with await otpmesh.proc_mesh(procs=1) as procs:
        echo = await procs.spawn("e", Echo)
        # The worker imports torch and numpy as the first ones arrive: before the baseline.
        await echo[0].echo((torch.zeros(2), numpy.zeros(2)))
        rt = await runtime()
        worker = procs._procs[0]
        peaks = {"worker": vm_kib(worker.pid, "VmPeak"), "controller": vm_kib("self", "VmPeak")}
        for addr in (worker.addr, rt.node.addr):
            for frame in frames:
                sock, _ = await dial(addr, rt.node.secret)
                sock.sendall(frame_header(len(frame)) + frame)
                sock.settimeout(30)
                assert await trio.to_thread.run_sync(sock.recv, 1) == b"", "not closed"
                sock.close()
                assert await echo[0].echo("still here") == "still here"
        for who, before in peaks.items():
            pid = worker.pid if who == "worker" else "self"
            grew = vm_kib(pid, "VmPeak") - before
            print(who, "VmPeak grew", grew, "KiB", flush=True)
            assert grew < 256 << 10, (who, grew)
    print("app answered", flush=True)

trio.run(main)
"""


@pytest.mark.timeout(120)
def test_hostile_frames_close_only_their_connection_and_the_app_keeps_answering() -> None:
    crash = msgpack.ExtType(
        _codec.EXT_ACTOR_CRASH, msgpack.packb(_empty(_codec.EXT_TENSOR, [2**31, 0]))
    )
    ref = msgpack.ExtType(_codec.EXT_ACTOR_REF, msgpack.packb(_empty(_codec.EXT_ARRAY, [2**31, 0])))
    frames = [
        msgpack.packb([0, 1, "e/0", "echo", [crash], {}]),  # a call with it as the argument
        msgpack.packb([2, 1, ref]),  # a reply carrying it
    ]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _APP_UNDER_CAP, str(2 << 30), *(f.hex() for f in frames)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "app answered" in done.stdout
    # Each connection closed for what its frame was, not because its decode ran out of memory
    # (under the cap a walk of 2**31 rows fails at once, asking for 16 GiB of row pointers;
    # without it, it grows until the kernel kills the process).
    closed = [line for line in done.stderr.splitlines() if "closed it: " in line]
    assert len(closed) >= 2 * len(frames), done.stderr[-3000:]
    for line in closed:
        assert "MemoryError" not in line and "bad_alloc" not in line, line
        assert "has no elements but 2147483648 rows" in line, line


def test_channel_forms_and_handles_bound_zero_element_shapes_too() -> None:
    """A channel buffer or tensor with no elements reads no bytes: its shape is bounded by the
    same rule, in the frame's form and in the handle."""
    from otpmesh.rdma._error import RDMAError
    from otpmesh.rdma._handle import Handle

    form = ["ndarray", "<f4", [2**31, 0]]
    with pytest.raises(otpmesh.ProtocolError, match="2147483648 rows before its first zero"):
        unpack(_ext(_codec.EXT_CHANNEL_BUFFER, [form, {"id": 1}]))
    handle = {
        "id": 1,
        "token": "0" * 32,
        "owner": "somewhere",
        "nbytes": 0,
        "dtype": "float32",
        "shape": [2**31, 0],
        "backends": ["shm"],
    }
    with pytest.raises(RDMAError, match="2147483648 rows before its first zero"):
        Handle.from_wire(handle)
    with pytest.raises(RDMAError, match="nonzero dims of product 2147483648"):
        Handle.from_wire({**handle, "shape": [0, 2**31]})
    assert Handle.from_wire({**handle, "shape": [0, 2**20]}).shape == (0, 2**20)
