"""Endpoint signatures as callers see them: a call's arguments are bound against the endpoint's
parameters in the caller, before anything is sent, so a wrong number of arguments or an unknown
keyword is a TypeError there and the actor is never touched. The actor's process binds them
again (a caller that had no signature), and answers a mismatch as the caller's error.

A signature is compact, and travels with refs and meshes: the parameter names after ``self``,
and one letter per parameter for its kind, as ``inspect`` names them:

    p  positional-only, required         P  positional-only, with a default
    a  positional or keyword, required   A  positional or keyword, with a default
    v  *args
    k  keyword-only, required            K  keyword-only, with a default
    w  **kwargs

``(self, x, y=1, *rest, z, **extra)`` is ``["x", "y", "rest", "z", "extra"]`` and ``"aAvkw"``.
Python's own rules fix their order (SIGNATURE_KINDS), which a receiver checks along with their
types and sizes before it builds anything (``_wire/_payloads.py``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping
from typing import Any

#: The kinds of a signature, in the order Python allows them (a required positional parameter
#: never follows one with a default).
SIGNATURE_KINDS = re.compile(r"p*(?:a*|P*)A*v?[kK]*w?")
#: Signatures with more parameters than this, or a longer name, travel without one (calls to
#: them are checked in the actor's process only): what a receiver decodes stays small.
MAX_PARAMS = 64
MAX_NAME = 64

_KIND_LETTERS = {
    (inspect.Parameter.POSITIONAL_ONLY, True): "p",
    (inspect.Parameter.POSITIONAL_ONLY, False): "P",
    (inspect.Parameter.POSITIONAL_OR_KEYWORD, True): "a",
    (inspect.Parameter.POSITIONAL_OR_KEYWORD, False): "A",
    (inspect.Parameter.VAR_POSITIONAL, True): "v",
    (inspect.Parameter.KEYWORD_ONLY, True): "k",
    (inspect.Parameter.KEYWORD_ONLY, False): "K",
    (inspect.Parameter.VAR_KEYWORD, True): "w",
}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_INFINITE = 1 << 62


class Params:
    """One endpoint's parameters (after ``self``): `names` and their `kinds` (one letter each,
    the module docstring). Binding a call's arguments costs two comparisons when it passes
    positional arguments only; the rest is precomputed here."""

    __slots__ = ("_index", "_least", "_most", "_positional", "kinds", "names")

    def __init__(self, names: tuple[str, ...], kinds: str) -> None:
        self.names = names
        self.kinds = kinds
        self._positional = sum(kind in "pPaA" for kind in kinds)
        required = sum(kind in "pa" for kind in kinds)
        # Positional arguments alone fit when there are at least `_least` (and no required
        # keyword-only parameter) and at most `_most` of them.
        self._least = _INFINITE if "k" in kinds else required
        self._most = _INFINITE if "v" in kinds else self._positional
        self._index: dict[str, int] | None = None

    @classmethod
    def of(cls, fn: Any) -> Params | None:
        """The parameters of an endpoint method (its first one, the instance, left out), or
        None when Python cannot tell them (a builtin)."""
        drop = not isinstance(fn, staticmethod)
        if isinstance(fn, staticmethod | classmethod):
            fn = fn.__func__
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        if drop and params and params[0].kind in _POSITIONAL:
            params = params[1:]
        # (*args and **kwargs have no default: "required", as the table says)
        kinds = "".join(_KIND_LETTERS[p.kind, p.default is p.empty] for p in params)
        return cls(tuple(p.name for p in params), kinds)

    def problem(self, nargs: int, kwargs: Mapping[str, Any]) -> str | None:
        """Why `nargs` positional arguments and `kwargs` do not bind to these parameters (in
        Python's words), or None when they do."""
        if not kwargs and self._least <= nargs <= self._most:
            return None
        return self._mismatch(nargs, kwargs)

    def _mismatch(self, nargs: int, kwargs: Mapping[str, Any]) -> str | None:
        names, kinds = self.names, self.kinds
        if nargs > self._most:
            most = self._positional
            return f"takes {most} positional argument{'s' * (most != 1)} but {nargs} were given"
        if self._index is None:
            self._index = {name: i for i, name in enumerate(names)}
        free = "w" in kinds  # a **kwargs takes what no parameter does
        for key in kwargs:
            i = self._index.get(key)
            kind = "w" if i is None else kinds[i]
            if kind in "vw" or kind in "pP":
                if not free:
                    what = "positional-only argument" if kind in "pP" else "keyword argument"
                    return f"got an unexpected {what} {key!r}"
            elif kind in "aA" and i is not None and i < nargs:
                return f"got multiple values for argument {key!r}"
        missing = [
            names[i]
            for i, kind in enumerate(kinds)
            if (kind in "pa" and i >= nargs and (kind == "p" or names[i] not in kwargs))
            or (kind == "k" and names[i] not in kwargs)
        ]
        if missing:
            listed = ", ".join(repr(name) for name in missing)
            return f"missing {len(missing)} required argument{'s' * (len(missing) != 1)}: {listed}"
        return None

    def wire(self) -> list[Any] | None:
        """How it travels ([names, kinds]), or None when it is too large to."""
        if len(self.names) > MAX_PARAMS or any(len(name) > MAX_NAME for name in self.names):
            return None
        return [list(self.names), self.kinds]

    def __str__(self) -> str:
        parts: list[str] = []
        for i, (name, kind) in enumerate(zip(self.names, self.kinds, strict=True)):
            if kind in "kK" and (i == 0 or self.kinds[i - 1] not in "vkK"):
                parts.append("*")
            parts.append(
                {"v": f"*{name}", "w": f"**{name}"}.get(
                    kind, name + ("=..." if kind in "PAK" else "")
                )
            )
            if kind in "pP" and (i + 1 == len(self.kinds) or self.kinds[i + 1] not in "pP"):
                parts.append("/")
        return f"({', '.join(parts)})"


class Endpoints:
    """The endpoints of an actor class as its callers see them: each name with its Params, or
    None where they are not known. Empty: not known at all (an actor named by import path),
    so any endpoint may be called with any arguments, as the actor's process will check."""

    __slots__ = ("_params", "_wire")

    def __init__(self, params: Mapping[str, Params | None]) -> None:
        self._params = dict(params)
        self._wire: list[Any] | None = None

    @classmethod
    def of(cls, endpoints: Mapping[str, Any]) -> Endpoints:
        """From ``Actor.endpoints()``: each EndpointInfo's params."""
        return cls({name: info.params for name, info in endpoints.items()})

    def params(self, name: str) -> Params | None:
        return self._params.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def to_wire(self) -> list[Any]:
        """Each endpoint, sorted by name: its name alone, or [name, names, kinds]."""
        if self._wire is None:
            entries: list[Any] = []
            for name in sorted(self._params):
                params = self._params[name]
                shape = None if params is None else params.wire()
                entries.append(name if shape is None else [name, *shape])
            self._wire = entries
        return self._wire

    @classmethod
    def from_wire(cls, entries: list[Any]) -> Endpoints:
        """From entries ``_payloads.endpoints`` has checked."""
        found: dict[str, Params | None] = {}
        for entry in entries:
            if type(entry) is str:
                found[entry] = None
            else:
                found[entry[0]] = Params(tuple(entry[1]), entry[2])
        return cls(found)


def bind_error(who: str, endpoint: str, params: Params, problem: str) -> str:
    """The TypeError's words for a call to `endpoint` of `who` whose arguments do not bind."""
    return f"{who}: {endpoint}() {problem}; the endpoint is {endpoint}{params}"
