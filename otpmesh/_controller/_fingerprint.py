"""What a takeover compares before it adopts anything: the tree and the actors' code.

A standby that runs other code than the controller it replaces would adopt actors that still
run the old code, start new incarnations with the new, and mix both without a word. So the
journal's app record carries a fingerprint: each node of the tree as declared (its outline:
path, kind, actor class, shape, strategy, restart, intensity; and its arguments), and for each
actor class the source of the module that defines it (a constant changed in a job file changes
what its actors compute). A standby whose fingerprint differs refuses and says what differs,
unless told ``Takeover(..., upgrade=True)`` (docs/guides/takeover.md, "Running other code").
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from typing import Any

from .._core._actor import class_path
from .._core._outline import outline
from .._core._spec import Mesh, Supervisor, Worker, walk


def fingerprint(tree: Supervisor | Mesh) -> dict[str, Any]:
    """The tree's and its actor classes' fingerprints, as the journal keeps them."""
    nodes = {
        row[0]: _digest(json.dumps([*row, _arguments(spec)], default=repr))
        for row, (_, spec) in zip(outline(tree), walk(tree), strict=True)
    }
    # Each class once: a mesh's slot workers name its class again (a module read per class).
    actors = {spec.actor for _, spec in walk(tree) if isinstance(spec, Worker | Mesh)}
    return {"nodes": nodes, "classes": dict(_code(actor) for actor in actors)}


def differences(journalled: Any, ours: dict[str, Any]) -> list[str]:
    """What differs between the journal's fingerprint and ours, in words (empty: nothing)."""
    if not isinstance(journalled, dict):
        return ["the running controller recorded no fingerprint (another otpmesh version)"]
    said = _compare(journalled.get("classes"), ours["classes"], "class {}", "its module's code")
    said += _compare(
        journalled.get("nodes"),
        ours["nodes"],
        "{}",
        "its spec (shape, strategy, restart, limits or args)",
    )
    return said


def _compare(theirs: Any, ours: dict[str, str], name: str, what: str) -> list[str]:
    """The keys of `theirs` (the journal's digests) and `ours` that differ, in words."""
    theirs = theirs if isinstance(theirs, dict) else {}
    said = []
    for key in sorted(set(theirs) | set(ours)):
        named = name.format(key)
        if key not in ours:
            said.append(f"{named} is in the running tree, not in this one")
        elif key not in theirs:
            said.append(f"{named} is new in this tree")
        elif theirs[key] != ours[key]:
            said.append(f"{named}: {what} changed")
    return said


def _arguments(spec: Supervisor | Worker | Mesh) -> str:
    if isinstance(spec, Worker | Mesh):
        return repr((spec.args, dict(spec.kwargs), spec.progress_deadline, spec.shutdown))
    return repr(spec.shutdown)


def _code(actor: type | str) -> tuple[str, str]:
    """(the class's import path, a digest of its module's source)."""
    if isinstance(actor, str):
        return actor, _digest(actor)  # named by path: its code is not loaded here
    module = sys.modules.get(actor.__module__)
    try:
        source = inspect.getsource(module) if module is not None else inspect.getsource(actor)
    except (OSError, TypeError):  # a notebook cell, python -c: the methods' code then
        source = repr(
            [
                (name, getattr(value, "__code__", None) and value.__code__.co_code)
                for name, value in sorted(vars(actor).items())
            ]
        )
    try:
        name = class_path(actor)
    except TypeError:
        name = actor.__qualname__
    return name, _digest(source)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
