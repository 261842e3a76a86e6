"""numpy arrays on the wire (inline, below the channel threshold): bit-exact for every dtype that
travels as raw bytes, the receiver's own and writable; dtypes that cannot travel are refused on
both sides; and the codec never imports numpy for a sender that did not."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh._wire import _codec
from otpmesh._wire._codec import pack, unpack

np = pytest.importorskip("numpy", reason="numpy is optional (the 'test' extra installs it)")
hnp = pytest.importorskip("hypothesis.extra.numpy")

# Every dtype kind that travels, in both byte orders where there are two.
DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.byte_string_dtypes(min_len=1),
    hnp.unicode_string_dtypes(endianness="?", min_len=1),
)


@settings(max_examples=200, deadline=None)
@given(
    dtype=DTYPES,
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    data=st.data(),
)
def test_arrays_round_trip_bit_exactly(dtype: object, shape: tuple[int, ...], data: object) -> None:
    dt = np.dtype(dtype)
    numel = int(np.prod(shape))
    raw = data.draw(st.binary(min_size=numel * dt.itemsize, max_size=numel * dt.itemsize))  # type: ignore[attr-defined]
    sent = np.frombuffer(raw, dtype=dt).reshape(shape) if numel else np.empty(shape, dt)
    back = unpack(pack(("x", sent)))[1]
    assert type(back) is np.ndarray
    assert back.dtype == sent.dtype and back.dtype.str == sent.dtype.str
    assert back.shape == sent.shape and back.tobytes() == sent.tobytes()
    assert back.flags.writeable  # the sender's was read-only (a view of bytes)


def test_non_contiguous_arrays_send_their_values_in_order() -> None:
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    for view in (a.T, a[::2, 1::3], np.asfortranarray(a)):
        back = unpack(pack(view))
        assert back.shape == view.shape and np.array_equal(back, view)


def test_arrays_that_cannot_travel_as_bytes_are_refused_with_what_to_send() -> None:
    with pytest.raises(otpmesh.EncodeError, match=r"dtype dtype\('O'\).*no objects"):
        pack(np.array([object()]))
    with pytest.raises(otpmesh.EncodeError, match="no fields"):
        pack(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")]))
    with pytest.raises(otpmesh.EncodeError, match=r"numpy array subclass.*numpy\.asarray"):
        pack(np.ma.masked_array([1, 2], mask=[0, 1]))


@pytest.mark.parametrize("name", ["|O8", "O", "<f4,<f4", "(2,)<f4", "<f5", 7, "<U0", "|V0"])
def test_a_received_array_of_a_dtype_that_does_not_travel_is_a_protocol_error(
    name: object,
) -> None:
    header = msgpack.packb([name, [1]])
    payload = len(header).to_bytes(2, "big") + header + b"\x00" * 8
    frame = msgpack.packb(msgpack.ExtType(_codec.EXT_ARRAY, payload))
    with pytest.raises(otpmesh.ProtocolError, match="dtype"):
        unpack(frame)


def test_a_received_array_whose_bytes_do_not_match_its_shape_is_a_protocol_error() -> None:
    header = msgpack.packb(["<f4", [3]])
    payload = len(header).to_bytes(2, "big") + header + b"\x00" * 8
    with pytest.raises(otpmesh.ProtocolError, match="needs 12 bytes, frame has 8"):
        unpack(msgpack.packb(msgpack.ExtType(_codec.EXT_ARRAY, payload)))


def test_the_codec_never_imports_numpy_for_a_sender_without_it() -> None:
    program = (
        "import sys; from otpmesh._wire._codec import pack, unpack; "
        "unpack(pack([b'x' * (2 << 20), bytearray(3), {'a': (1, 2.0)}])); "
        "print('numpy' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
