"""Whether a value can travel to an actor's process: a spec's ``args`` and ``kwargs`` are
checked when the spec is built, so a lambda or an open file is refused where it was written.

The wire carries data, never code (``_wire/_codec.py``): msgpack's types (None, bools,
numbers, strings, bytes, lists, dicts), tuples, torch tensors, numpy arrays, the core's exit
reasons and value meshes, and the values of the layers above that say how they travel (a
``_wire_ext`` class attribute: actor refs and meshes, RDMA buffers). The core cannot import the
codec, so this walk accepts those types by what they are; it refuses anything else (a function,
a class, an open file, a dataclass instance). Specs themselves count as data (an owner is given
the subtree it starts: ``_spec.py`` says so). What only the codec can refuse (too deep, too
large, a dtype with no wire form) fails the child's start, naming the argument
(``_controller/_placement.py``, ``spawn_on``).
"""

from __future__ import annotations

import inspect
import io
import sys
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from ._exits import ActorCrash, Hung, ProcessExit
from ._valuemesh import ValueMesh

#: The plain values msgpack packs itself (subclasses too: an IntEnum travels as its int).
_PLAIN = (type(None), bool, int, float, str, bytes, bytearray, memoryview)
_CORE = (ActorCrash, ProcessExit, Hung, ValueMesh)
#: How many values one check looks at, and how deep: past either, the rest is left to the codec
#: at start (a bound on the cost of building a spec with a large argument).
MAX_VISITS = 10_000
MAX_DEPTH = 32

WHAT_TRAVELS = (
    "data the wire carries: None, bools, numbers, str, bytes, lists, tuples, dicts, torch "
    "tensors, numpy arrays, actor refs and meshes (never code: no pickle)"
)


def first_unsendable(
    args: Sequence[Any], kwargs: Mapping[str, Any], also: tuple[type, ...] = ()
) -> tuple[str, Any] | None:
    """Where the first value that cannot travel is ('args[0]', "kwargs['lr'][2]") and what
    it is, or None. Values of the types `also` count as data too."""
    budget = [MAX_VISITS]
    named = [(f"args[{i}]", v) for i, v in enumerate(args)]
    named += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for where, value in named:
        found = _walk(value, where, 0, budget, also)
        if found is not None:
            return found
    return None


def why_not(value: Any) -> str:
    """Why a value `first_unsendable` found cannot travel, in words."""
    kind = type(value)
    if isinstance(value, type):
        what = "a class is code"
    elif inspect.isroutine(value) or isinstance(value, partial):
        what = "a function is code"
    elif isinstance(value, io.IOBase):
        what = "an open file belongs to this process"
    else:
        what = f"a {kind.__module__}.{kind.__qualname__} is not data"
    return f"{what}: it cannot travel to the actor's process"


def _walk(
    value: Any, where: str, depth: int, budget: list[int], also: tuple[type, ...]
) -> tuple[str, Any] | None:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return None  # past the bound: the codec checks the rest when the tree starts
    if isinstance(value, _PLAIN):
        return None
    if isinstance(value, list | tuple):
        items: Iterator[tuple[str, Any]] = (
            (f"{where}[{index}]", item) for index, item in enumerate(value)
        )
    elif isinstance(value, dict):
        items = (
            pair
            for key, item in value.items()
            for pair in ((f"{where} key {key!r}", key), (f"{where}[{key!r}]", item))
        )
    else:
        kind = type(value)
        if kind in _CORE or kind in also or getattr(kind, "_wire_ext", None) is not None:
            return None
        return None if _array(value) else (where, value)
    for inner, item in items:
        if budget[0] < 0:
            return None
        found = _walk(item, inner, depth + 1, budget, also)
        if found is not None:
            return found
    return None


def _array(value: Any) -> bool:
    """A torch tensor or numpy array (looked up, never imported: a value of a module that was
    never imported cannot exist)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)
