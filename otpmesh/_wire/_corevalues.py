"""How the core's values that travel as extensions (exit reasons, value meshes) become wire data
and back. The codec sits above the core, so it knows them itself (_codec.py gives each its code).
Each "from data" checks its payload's type and arity, field by field, before it builds anything
(``_payloads.py``); each "problem" says why a value's data could not travel, so that a sender
refuses to send what its receiver would refuse (closing the connection)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from .._core._exits import ActorCrash, Hung, ProcessExit
from .._core._valuemesh import ValueMesh
from . import _payloads

_CRASH_FIELDS = (_payloads.STR,) * 4  # type name, message, traceback, endpoint
_EXIT_FIELDS = (_payloads.INT, _payloads.STR)  # pid, how
_HUNG_FIELDS = (_payloads.STR, _payloads.NUMBER, _payloads.STR, _payloads.STR)


class CoreValue(NamedTuple):
    """One of the core's types on the wire: to its data, from its data, and why its data cannot
    travel (None: it can)."""

    kind: type
    to_data: Callable[[Any], Any]
    from_data: Callable[[Any], Any]
    problem: Callable[[Any], str | None]


def _value_mesh_problem(data: list[Any]) -> str | None:
    return _payloads.mesh_shape_problem(data[0], len(data[1]))


def _value_mesh_from(data: Any) -> ValueMesh[Any]:
    shape, values = _payloads.fields(data, "value mesh", (_payloads.LIST, _payloads.LIST))
    return ValueMesh(_payloads.mesh_shape(shape, len(values), "value mesh"), values)


def _fields(kind: type, name: str, types: Any, to_data: Callable[[Any], Any]) -> CoreValue:
    """A value that travels as a fixed list of fields of these `types`, built by `kind(*fields)`."""
    return CoreValue(
        kind,
        to_data,
        lambda d: kind(*_payloads.fields(d, name, types)),
        partial(_payloads.fields_problem, types=types),
    )


ACTOR_CRASH = _fields(
    ActorCrash,
    "actor crash",
    _CRASH_FIELDS,
    lambda c: [c.type_name, c.message, c.traceback, c.endpoint],
)
PROCESS_EXIT = _fields(ProcessExit, "process exit", _EXIT_FIELDS, lambda p: [p.pid, p.how])
HUNG = _fields(Hung, "hung", _HUNG_FIELDS, lambda h: [h.endpoint, h.seconds, h.how, h.stacks])
VALUE_MESH = CoreValue(
    ValueMesh,
    lambda vm: [list(vm.shape.items()), vm.values()],
    _value_mesh_from,
    _value_mesh_problem,
)
