"""Length-prefixed framing, sans-IO: every frame is its length (u32, big-endian) and then its
msgpack payload (docs/wire.md). ``FrameDecoder.feed`` takes bytes and gives whole frames, so
garbage can be fed to it directly in tests; an oversized frame is a ProtocolError."""

from __future__ import annotations

import struct

from .._core._errors import ProtocolError

#: Largest frame accepted; bigger tensors belong on the tensor channel, not the control wire.
MAX_FRAME_SIZE = 1 << 30
_LEN = struct.Struct(">I")


def frame_header(size: int) -> bytes:
    """The 4-byte length prefix of a frame whose payload has `size` bytes."""
    if size > MAX_FRAME_SIZE:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME_SIZE} bytes")
    return _LEN.pack(size)


class FrameDecoder:
    """Splits a byte stream into frame payloads. Raises ProtocolError on an oversized frame."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._max = max_frame_size

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size > self._max:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self._max} bytes")
            stop = pos + 4 + size
            if stop > end:
                break
            frames.append(bytes(buf[pos + 4 : stop]))
            pos = stop
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame (non-zero at EOF = truncation)."""
        return len(self._buf)
