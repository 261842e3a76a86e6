"""Calls are checked against the endpoint's signature: in the caller (a TypeError, nothing sent)
and, for a caller that has no signature, in the actor's process (answered as the caller's
error). The actor is never touched. Signatures travel with refs and meshes, checked on arrival.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otpmesh
from otpmesh import LogKind, Supervisor, Worker
from otpmesh._core._signature import MAX_NAME, MAX_PARAMS, Params
from otpmesh._wire import _codec
from tests.actors import Echo, Member
from tests.conftest import run_trio

# ---- binding, against Python's own ----------------------------------------------------------


@st.composite
def signatures(draw: st.DrawFn) -> str:
    """Parameter kinds in an order Python allows (_core/_signature.py's letters)."""
    part = lambda letter: letter * draw(st.integers(0, 2))  # noqa: E731
    middle = part("a") if draw(st.booleans()) else part("P")
    return "".join(
        (
            part("p"),
            middle,
            part("A"),
            part("v")[:1],
            "".join(draw(st.lists(st.sampled_from("kK"), max_size=2))),
            part("w")[:1],
        )
    )


def _function(kinds: str) -> Any:
    """A method with parameters of those kinds, named a, b, c, ... in order."""
    parts = []
    for i, kind in enumerate(kinds):
        name = "abcdefghijklmnop"[i]
        if kind in "kK" and (i == 0 or kinds[i - 1] not in "vkK"):
            parts.append("*")
        parts.append({"v": f"*{name}", "w": f"**{name}"}.get(kind, name))
        if kind in "PAK":
            parts[-1] += "=0"
        if kind in "pP" and (i + 1 == len(kinds) or kinds[i + 1] not in "pP"):
            parts.append("/")
    namespace: dict[str, Any] = {}
    exec(f"def method(self, {', '.join(parts)}): pass", namespace)
    return namespace["method"]


@settings(max_examples=400, deadline=None)
@given(
    kinds=signatures(),
    nargs=st.integers(0, 6),
    keywords=st.lists(st.sampled_from("abcdefghzz"), unique=True, max_size=4),
)
def test_binding_agrees_with_python(kinds: str, nargs: int, keywords: list[str]) -> None:
    method = _function(kinds)
    params = Params.of(method)
    assert params is not None and params.kinds == kinds
    kwargs = dict.fromkeys(keywords, 0)
    try:
        method(None, *range(nargs), **kwargs)  # its body does nothing: only binding can fail
        binds = True
    except TypeError:
        binds = False
    assert (params.problem(nargs, kwargs) is None) == binds, (kinds, nargs, kwargs)


def test_a_signature_reads_as_python_writes_it() -> None:
    def method(self: Any, a: int, /, b: int = 1, *rest: int, c: int, d: int = 2, **kw: int) -> None:
        pass

    assert str(Params.of(method)) == "(a, /, b=..., *rest, c, d=..., **kw)"
    assert Params.of(method).wire() == [["a", "b", "rest", "c", "d", "kw"], "pAvkKw"]  # type: ignore[union-attr]


def test_a_signature_too_large_to_travel_travels_as_a_name_only() -> None:
    many = Params(tuple(f"p{i}" for i in range(MAX_PARAMS + 1)), "a" * (MAX_PARAMS + 1))
    long = Params(("x" * (MAX_NAME + 1),), "a")
    assert many.wire() is None and long.wire() is None
    assert many.problem(MAX_PARAMS + 1, {}) is None  # still checked where it is known


# ---- in the caller ---------------------------------------------------------------------------


async def _stream(mesh: Any, *args: Any, **kwargs: Any) -> list[Any]:
    return [value async for _, value in mesh.echo.stream(*args, **kwargs)]


BAD_CALLS = [
    (lambda m: m[0].echo(), r"^w/0: echo\(\) missing 1 required argument: 'x'"),
    (lambda m: m[1].echo(1, 2), r"^w/1: echo\(\) takes 1 positional argument but 2 were given"),
    (lambda m: m.echo(1, y=2), r"^w: echo\(\) got an unexpected keyword argument 'y'"),
    (lambda m: m.echo(1, x=2), r"^w: echo\(\) got multiple values for argument 'x'"),
    (lambda m: m.echo.choose(), r"^w: echo\(\) missing 1 required argument: 'x'"),
    (lambda m: m.echo.broadcast(1, 2), r"^w: echo\(\) takes 1 positional argument but 2 were"),
    (lambda m: _stream(m, z=1), r"^w: echo\(\) got an unexpected keyword argument 'z'"),
    (lambda m: m[0].record(), r"^w/0: record\(\) missing 1 required argument: 'x'"),
    (lambda m: m[0].whoami(1), r"^w/0: whoami\(\) takes 0 positional arguments but 1 were given"),
]


def test_a_call_that_does_not_bind_is_a_type_error_in_the_caller_and_nothing_is_sent() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            await mesh[0].record("kept")
            for call, match in BAD_CALLS:
                with pytest.raises(TypeError, match=match + r".*; the endpoint is \w+\("):
                    await call(mesh)
            assert await mesh[0].history() == ["kept"]  # the same actor, its state untouched
            assert (await mesh.echo(x=3)).values() == [3, 3]
            assert not procs.events.of_kind(LogKind.CHILD_EXITED)

    run_trio(body)


def test_signatures_travel_with_refs_and_meshes() -> None:
    async def body() -> None:
        async with await otpmesh.proc_mesh(procs=2) as procs:
            mesh = await procs.spawn("w", Echo)
            # Each went to an actor's process and back: decoded and encoded again there.
            ref, whole = await mesh[0].echo(mesh[1]), await mesh[0].echo(mesh)
            with pytest.raises(TypeError, match=r"^w/1: echo\(\) takes 1 positional"):
                await ref.echo(1, 2)
            with pytest.raises(TypeError, match=r"^w: echo\(\) got an unexpected keyword"):
                await whole.echo(y=1)
            assert await ref.echo(5) == 5
            # An actor calling through a ref it was sent checks there too (Member.relay calls
            # the endpoint with no arguments).
            relay = await procs.spawn("relay", Member)
            with pytest.raises(
                otpmesh.ActorError, match=r"raised TypeError: w/1: echo\(\) missing"
            ):
                await relay[0].relay(mesh[1], "echo")

    run_trio(body)


# ---- in the actor's process ------------------------------------------------------------------


def test_a_caller_without_signatures_gets_a_type_error_from_the_actor_which_lives_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An actor named by import path: the controller never imports its class, so its calls
    carry no signature and the actor's process checks them."""
    tree = Supervisor("s", children=[Worker("a", "tests.actors:Echo")])

    async def body() -> None:
        async with otpmesh.start(tree) as app:
            ref = app.actor("s/a")
            await ref.record("kept")
            with pytest.raises(TypeError, match=r"^s/a: echo\(\) takes 1 positional argument but"):
                await ref.echo(1, 2)  # an async endpoint
            with pytest.raises(TypeError, match=r"^s/a: record\(\) got an unexpected keyword"):
                await ref.record(1, y=2)  # a plain-def one, run inline
            await ref.record.broadcast()  # a cast: no one to answer, dropped
            assert await ref.history() == ["kept"]
            assert not app.events.of_kind(LogKind.CHILD_EXITED)

    run_trio(body)


# ---- on the wire -----------------------------------------------------------------------------


def _ref_payload(endpoints: Any) -> bytes:
    data = ["r", endpoints, ["r/0", "addr", True], None]
    return msgpack.packb(msgpack.ExtType(_codec.EXT_ACTOR_REF, msgpack.packb(data)))


def test_a_ref_with_signatures_decodes_and_one_with_names_only_still_does() -> None:
    ref = _codec.unpack(_ref_payload(["old", ["echo", ["x", "y"], "aA"]]))
    assert str(ref._endpoints.params("echo")) == "(x, y=...)"
    assert ref._endpoints.params("old") is None and "old" in ref._endpoints


@pytest.mark.parametrize(
    "entry",
    [
        5,
        ["e"],
        ["e", "x", "a"],
        ["e", ["x"], "z"],  # an unknown kind
        ["e", ["x", "y"], "a"],  # more names than kinds
        ["e", ["x", "x"], "aa"],  # a repeated name
        ["e", [1], "a"],
        ["e", ["x", "y"], "Aa"],  # a required parameter after one with a default
        ["e", ["x", "y"], "kv"],  # *args after a keyword-only parameter
        ["e", [f"p{i}" for i in range(MAX_PARAMS + 1)], "a" * (MAX_PARAMS + 1)],
        ["e", ["x" * (MAX_NAME + 1)], "a"],
    ],
)
def test_a_malformed_signature_is_a_protocol_error(entry: Any) -> None:
    with pytest.raises(otpmesh.ProtocolError, match="malformed actor ref's endpoints"):
        _codec.unpack(_ref_payload([entry]))
    mesh = ["m", [entry], [["x", 1]], [["m/0", "addr", False]], None]
    with pytest.raises(otpmesh.ProtocolError, match="malformed actor mesh's endpoints"):
        _codec.unpack(msgpack.packb(msgpack.ExtType(_codec.EXT_ACTOR_MESH, msgpack.packb(mesh))))


def test_bad_casts_are_logged_where_they_arrive(caplog: pytest.LogCaptureFixture) -> None:
    tree = Supervisor("s", children=[Worker("a", "tests.actors:Echo")])

    async def body() -> None:
        async with otpmesh.start(tree, placement="local") as app:
            with caplog.at_level(logging.WARNING, logger="otpmesh.actor"):
                await app.actor("s/a").record.broadcast(1, 2)
                assert await app.actor("s/a").history() == []
        assert "s/a: a cast was dropped: s/a: record() takes 1 positional" in caplog.text

    run_trio(body)


def test_an_endpoint_overridden_without_the_decorator_is_checked_as_overridden() -> None:
    class Base(otpmesh.Actor):
        @otpmesh.endpoint
        async def step(self, x: int) -> int:
            return x

    class Child(Base):
        async def step(self, x: int, scale: int = 1) -> int:  # still the endpoint 'step'
            return x * scale

    assert str(Base.endpoints()["step"].params) == "(x)"
    assert str(Child.endpoints()["step"].params) == "(x, scale=...)"
