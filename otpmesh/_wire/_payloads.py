"""What an extension value's payload must be before anything is built from it.

msgpack bounds its own work by the bytes it is given: an array's declared length cannot exceed
the bytes left. Python code that unpacks a payload is bounded only by what it iterates:
``ActorCrash(*d)`` or ``frozenset(endpoints)`` walk whatever ``d`` is, and a zero-element
tensor of shape ``[2**31, 0]`` (27 bytes of frame) walks 2**31 rows. So every payload is checked
here for its type and arity, field by field and with exact types (``bool`` is not an ``int``,
a tensor is not a list), before it is unpacked: what passes holds lists, strings and numbers
whose sizes msgpack already bounded by the frame. Sans-IO; the receiver's errors are
``ProtocolError``, which close only the connection the payload came on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core._errors import ProtocolError
from .._core._signature import MAX_NAME, MAX_PARAMS, SIGNATURE_KINDS
from ._brief import brief

STR: tuple[type, ...] = (str,)
INT: tuple[type, ...] = (int,)
BYTES: tuple[type, ...] = (bytes,)
BOOL: tuple[type, ...] = (bool,)
NUMBER: tuple[type, ...] = (int, float)
OPTIONAL_NUMBER: tuple[type, ...] = (int, float, type(None))
LIST: tuple[type, ...] = (list,)
#: A shape pair ([name, size]) arrives as a list, or as a tuple (how senders pack dict items).
PAIR: tuple[type, ...] = (list, tuple)


def fields_problem(data: Any, types: Sequence[tuple[type, ...]]) -> str | None:
    """Why `data` is not an array of ``len(types)`` fields of those exact types, or None."""
    if type(data) is not list:
        return f"is not an array of {len(types)} fields: {brief(data)}"
    if len(data) != len(types):
        return f"has {len(data)} fields, not {len(types)}: {brief(data)}"
    for i, (value, allowed) in enumerate(zip(data, types, strict=True)):
        if type(value) not in allowed:
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            return f"field {i} is {brief(value)}, not {names}"
    return None


def fields(data: Any, what: str, types: Sequence[tuple[type, ...]]) -> list[Any]:
    """`data`, checked to be an array of ``len(types)`` fields of those exact types."""
    problem = fields_problem(data, types)
    if problem is not None:
        raise ProtocolError(f"malformed {what} payload: it {problem}")
    return data  # type: ignore[no-any-return]


def malformed(what: str, problem: str) -> ProtocolError:
    """The error for a payload of `what` whose fields have the right types but `problem`."""
    return ProtocolError(f"malformed {what} payload: it has {problem}")


def strings(data: Any, what: str) -> list[str]:
    """`data`, checked to be an array of strings."""
    if type(data) is not list or not all(type(item) is str for item in data):
        raise ProtocolError(f"malformed {what}: not an array of strings: {brief(data)}")
    return data


def endpoints(data: Any, what: str) -> list[Any]:
    """`data`, checked to be an actor's endpoints as they travel (``Endpoints.to_wire``): each
    a name, or [name, parameter names, kinds] with at most MAX_PARAMS distinct names of at most
    MAX_NAME characters and kinds in Python's order (``_core/_signature.py``)."""
    if type(data) is not list:
        raise ProtocolError(f"malformed {what}: not an array: {brief(data)}")
    for entry in data:
        if type(entry) is str:
            continue
        problem = fields_problem(entry, _ENDPOINT_FIELDS) or _signature_problem(entry)
        if problem is not None:
            raise ProtocolError(f"malformed {what}: an entry {problem}")
    return data


_ENDPOINT_FIELDS = (STR, LIST, STR)  # name, parameter names, kinds


def _signature_problem(entry: list[Any]) -> str | None:
    _, names, kinds = entry
    if len(names) > MAX_PARAMS or len(names) != len(kinds):
        return f"has {len(names)} parameter names for kinds {brief(kinds)} (at most {MAX_PARAMS})"
    if not all(type(name) is str and len(name) <= MAX_NAME for name in names):
        return f"has a parameter name that is no string of at most {MAX_NAME}: {brief(names)}"
    if len(set(names)) != len(names):
        return f"repeats a parameter name: {brief(names)}"
    if SIGNATURE_KINDS.fullmatch(kinds) is None:
        return f"has parameter kinds {brief(kinds)} in no order Python allows"
    return None


def mesh_shape_problem(pairs: Any, count: int) -> str | None:
    """Why `pairs` is not the shape of a mesh of `count` points, or None: [name, size] pairs
    with distinct string names and sizes whose product is at most `count` (or 1), so that
    walking its coordinates (``all_coords``) costs no more than its points do."""
    if type(pairs) is not list:
        return f"shape is not an array of [name, size] pairs: {brief(pairs)}"
    names: set[str] = set()
    points, most = 1, max(count, 1)
    for pair in pairs:
        if type(pair) not in PAIR or len(pair) != 2:
            return f"shape pair {brief(pair)} is not [name, size]"
        name, size = pair
        if type(name) is not str or name in names:
            return f"shape has a bad or repeated dimension name {brief(name)}"
        if type(size) is not int or not 0 <= size <= most:
            return f"shape dimension {name}={brief(size)} is not a size of at most {most}"
        names.add(name)
        points *= size
        if points > most:
            return f"shape {brief(pairs)} has more points than its {count} values"
    return None


def mesh_shape(pairs: Any, count: int, what: str) -> dict[str, int]:
    """The shape of a mesh of `count` points, checked (see ``mesh_shape_problem``)."""
    problem = mesh_shape_problem(pairs, count)
    if problem is not None:
        raise ProtocolError(f"malformed {what}: {problem}")
    return dict(pairs)
