"""The frames nodes exchange: kinds, layouts, and the pieces of encoding on the hot path.

Frames (msgpack arrays, see docs/wire.md):

    [0, call_id, actor_id, method, args, kwargs]   CALL  a reply is expected
    [0, call_id, actor_id, method, args, kwargs, chain]  the same, from inside an actor
    [1, actor_id, method, args, kwargs]            CAST  fire-and-forget
    [2, call_id, value]                            OK    reply
    [3, call_id, kind, type, message, traceback]   ERR   reply (kind: 'raised', 'dead', 'lost',
                                                         'badcall', 'deadlock')
    [4, call_id, op, payload]                      SYS   node operation (call_id -1: no reply)
    [5, payload]                                   HELLO a worker or host agent introduces itself
    [6, [reply, ...]]                              REPLIES OK/ERR frames batched by a host agent
    [7, call_id, actor_id]                         CANCEL the caller gave up on that call
    [8, port_id, token, what, value]               PORT  a value for a port of the receiving
                                                         node (what: 0 value, 1 close, 2 error)
"""

from __future__ import annotations

import functools
import struct
from typing import Any

from .._core._errors import ActorDiedError, ActorError, DeadlockError, ProtocolError
from . import _codec
from ._brief import brief
from ._tensors import Offer, PendingTensor

CALL, CAST, OK, ERR, SYS, HELLO, REPLIES, CANCEL, PORT = range(9)
_ARITY = {CALL: 6, CAST: 5, OK: 3, ERR: 6, SYS: 4, HELLO: 2, REPLIES: 2, CANCEL: 3, PORT: 5}
_WITH_CALL_ID = frozenset({CALL, OK, ERR, SYS, CANCEL})
_P_CALL = _codec.pack(CALL)
_P_CAST = _codec.pack(CAST)
_ARRAY6 = b"\x96"
_ARRAY7 = b"\x97"  # a CALL that carries the chain of actors waiting on it (_node/_chain.py)
_ARRAY5 = b"\x95"


def decode_message(frame: bytes) -> list[Any]:
    """The message in one frame (channel tensors left as placeholders); ProtocolError if the
    frame is not one."""
    return decode_frame(frame)[0]


def decode_frame(frame: bytes) -> tuple[list[Any], list[PendingTensor]]:
    """The message in one frame, and the channel tensors it names (for the node to fetch)."""
    msg, pending = _codec.unpack_pending(frame)
    if not isinstance(msg, list) or not msg or not isinstance(msg[0], int):
        raise ProtocolError(f"frame is not a message array: {brief(msg)}")
    arity = _ARITY.get(msg[0])
    if arity is None:
        raise ProtocolError(f"unknown frame kind {brief(msg[0])}")
    if len(msg) != arity and not (msg[0] == CALL and len(msg) == arity + 1):
        raise ProtocolError(f"frame kind {msg[0]} needs {arity} fields, got {len(msg)}")
    if msg[0] in _WITH_CALL_ID:
        _check_call_id(msg[1], -1 if msg[0] == SYS else 0)
    if msg[0] == REPLIES:
        if not isinstance(msg[1], list):
            raise ProtocolError("a REPLIES frame carries an array of replies")
        for reply in msg[1]:
            if not (
                isinstance(reply, list)
                and reply
                and reply[0] in (OK, ERR)
                and len(reply) == _ARITY[reply[0]]
            ):
                raise ProtocolError(f"not a reply in a REPLIES frame: {brief(reply)}")
            _check_call_id(reply[1], 0)
    return msg, pending


def _check_call_id(call_id: Any, lowest: int) -> None:
    """A call id is an int in [lowest, 2**64): anything else is a malformed frame, refused here,
    before it reaches a table lookup or a comparison deep in the node."""
    if type(call_id) is not int or not lowest <= call_id < 1 << 64:
        raise ProtocolError(f"bad call id {brief(call_id)}")


def _call_body(method: str, args: Any, kwargs: Any, offer: Offer | None = None) -> bytes:
    """The packed [method, args, kwargs] tail shared by every frame of one call; `offer`: the
    sending node's tensor channel, for large tensors."""
    if not kwargs and all(type(arg) in _codec.SCALARS for arg in args):
        packed = _codec.pack_plain([method, list(args), kwargs])  # nothing for the channel
    else:
        packed = _codec.pack([method, list(args), kwargs], offer)
    return packed[1:]  # drop the 3-element array header (0x93): the frame has its own


_UINT32 = struct.Struct(">BI")


def _pack_uint(n: int) -> bytes:
    """msgpack's uint32 encoding of a call id, without a trip through the packer."""
    return _UINT32.pack(0xCE, n) if n < 1 << 32 else _codec.pack(n)


@functools.lru_cache(maxsize=4096)
def pack_actor_id(actor_id: str) -> bytes:
    """An actor id as msgpack (a str), made once per actor: every call frame carries one."""
    return _codec.pack(actor_id)


def remote_error(path: str, msg: list[Any]) -> Exception:
    """The exception a caller sees for an ERR frame from the actor at `path`."""
    _, _, kind, type_name, message, tb = msg
    if kind == "dead":
        return ActorDiedError(path, str(message), delivered=False)
    if kind == "lost":  # a relayed call whose actor died after it was delivered (_fanout.py)
        return ActorDiedError(path, str(message))
    if kind == "deadlock":  # a call back into a busy actor, refused as it was delivered
        return DeadlockError(str(message).split(" -> "))
    if kind == "badcall":  # its arguments did not bind to the endpoint: the actor never ran it
        return TypeError(str(message))
    return ActorError(path, str(type_name), str(message), str(tb))
