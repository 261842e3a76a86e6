"""Specs as wire data: an actor in a worker declares a subtree; the controller runs it.

A spec travels as ``[kind, {field: value}]``: classes as their import paths, enums as their
words, children nested. The controller rebuilds it with the spec classes themselves, so every
check a spec makes when it is built is made again there, on what arrived.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from .._core._actor import class_path
from .._core._errors import ProtocolError
from .._core._healspec import Heal
from .._core._spec import Mesh, Supervisor, Worker
from .._wire._brief import brief

_KINDS: dict[str, type[Worker | Supervisor | Mesh]] = {
    "Worker": Worker,
    "Supervisor": Supervisor,
    "Mesh": Mesh,
}
#: How deep a spec may nest on the wire (the codec bounds a message's own nesting too).
MAX_DEPTH = 32


def spec_to_wire(spec: Worker | Supervisor | Mesh) -> list[Any]:
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if field.name == "actor":
            value = value if isinstance(value, str) else class_path(value)
        elif field.name == "children":
            value = [spec_to_wire(child) for child in value]
        elif isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, Heal):  # rebuilt from its fields (Mesh accepts a mapping)
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        fields[field.name] = value
    return [type(spec).__name__, fields]


def spec_from_wire(data: Any, depth: int = 0) -> Worker | Supervisor | Mesh:
    """The spec `data` describes; ProtocolError for a malformed one, SpecError for a bad one."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a spec nested more than {MAX_DEPTH} levels deep")
    if type(data) is not list or len(data) != 2 or type(data[1]) is not dict:
        raise ProtocolError(f"malformed spec: {brief(data)}")
    kind, fields = data
    cls = _KINDS.get(kind) if type(kind) is str else None
    if cls is None:
        raise ProtocolError(f"unknown kind of spec {brief(kind)}")
    fields = dict(fields)
    if "children" in fields:
        children = fields["children"]
        if type(children) is not list:
            raise ProtocolError(f"malformed spec children: {brief(children)}")
        fields["children"] = tuple(spec_from_wire(child, depth + 1) for child in children)
    if "id" not in fields or (cls is not Supervisor and "actor" not in fields):
        raise ProtocolError(f"a {kind} spec without its id or actor: {brief(data)}")
    positional = [fields.pop("id")]
    if cls is not Supervisor:
        positional.append(fields.pop("actor"))
    try:
        return cls(*positional, **fields)
    except TypeError as exc:
        raise ProtocolError(f"malformed {kind} spec: {exc}") from None
