"""Supervision specs: OTP's defaults, normalisation, and validation errors that teach the fix."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import pytest

import otpmesh
from otpmesh._core._spec import (
    ALL_FOR_ONE,
    ANY_SIGNIFICANT,
    BRUTAL_KILL,
    INFINITY,
    NEVER,
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    PERMANENT,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    Mesh,
    Strategy,
    Supervisor,
    Worker,
    walk,
)
from otpmesh._core._spec_errors import SpecError


class Learner(otpmesh.Actor):
    pass


def test_supervisor_defaults_are_otps() -> None:
    s = Supervisor("rl")
    assert (s.strategy, s.intensity, s.period, s.auto_shutdown) == (ONE_FOR_ONE, 1, 5.0, NEVER)
    assert (s.restart, s.shutdown, s.significant, s.children) == (PERMANENT, INFINITY, False, ())


def test_worker_defaults_are_otps() -> None:
    w = Worker("learner", Learner)
    assert (w.restart, w.shutdown, w.significant, w.args, dict(w.kwargs)) == (
        PERMANENT,
        5.0,
        False,
        (),
        {},
    )


def test_design_example_builds_positionally_and_by_keyword() -> None:
    tree = Supervisor(
        "rl",
        strategy=REST_FOR_ONE,
        intensity=5,
        period=60.0,
        children=[
            Mesh("learner", Learner, shape={"gpus": 1}),
            Mesh("rollouts", "pkg.rollout:Rollout", shape={"gpus": 4}, strategy=ONE_FOR_ONE),
            Worker("reward", Learner, restart=TRANSIENT),
        ],
    )
    assert isinstance(tree.children, tuple) and len(tree.children) == 3


def test_all_for_one_is_an_alias_of_one_for_all() -> None:
    assert ALL_FOR_ONE is ONE_FOR_ALL
    assert Supervisor("s", strategy="one_for_all").strategy is ONE_FOR_ALL  # type: ignore[arg-type]


def test_specs_are_frozen_and_copy_their_mutable_inputs() -> None:
    kwargs = {"lr": 0.1}
    w = Worker("w", Learner, args=[1, 2], kwargs=kwargs)
    kwargs["lr"] = 9.0
    assert w.args == (1, 2) and w.kwargs["lr"] == 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        w.kwargs["lr"] = 1.0  # type: ignore[index]


def test_numbers_and_otp_words_are_normalised() -> None:
    w = Worker("w", Learner, shutdown=2, restart="transient")  # type: ignore[arg-type]
    assert w.shutdown == 2.0 and isinstance(w.shutdown, float) and w.restart is TRANSIENT
    assert Worker("w", Learner, shutdown="brutal_kill").shutdown is BRUTAL_KILL  # type: ignore[arg-type]


def test_mesh_is_a_supervisor_of_one_permanent_worker_per_slot() -> None:
    m = Mesh(
        "rollouts",
        Learner,
        shape={"hosts": 2, "gpus": 2},
        strategy=ONE_FOR_ALL,
        intensity=3,
        shutdown=BRUTAL_KILL,
        restart=TRANSIENT,
        args=(7,),
    )
    s = m.as_supervisor()
    assert (s.id, s.strategy, s.intensity, s.restart, s.shutdown) == (
        "rollouts",
        ONE_FOR_ALL,
        3,
        TRANSIENT,
        INFINITY,
    )
    assert [c.id for c in s.children] == ["0", "1", "2", "3"] and m.size == 4
    assert all(
        isinstance(c, Worker)
        and c.restart is PERMANENT
        and c.shutdown is BRUTAL_KILL
        and c.args == (7,)
        for c in s.children
    )


def test_walk_yields_paths_parents_first() -> None:
    tree = Supervisor(
        "rl", children=[Worker("learner", Learner), Mesh("rollouts", Learner, shape={"gpus": 3})]
    )
    assert [p for p, _ in walk(tree)] == [
        "rl",
        "rl/learner",
        "rl/rollouts",
        "rl/rollouts/0",
        "rl/rollouts/1",
        "rl/rollouts/2",
    ]


# ---- validation -------------------------------------------------------------------------------


def test_duplicate_sibling_ids_are_rejected_with_the_path() -> None:
    with pytest.raises(SpecError, match=r"Worker 'rl/a': id='a' is invalid \(duplicate child id\)"):
        Supervisor("rl", children=[Worker("a", Learner), Worker("a", Learner)])


@pytest.mark.parametrize("bad", ["", "a/b", 3, None])
def test_ids_must_be_non_empty_without_slashes(bad: object) -> None:
    with pytest.raises(SpecError, match=r"id=.* allowed: a non-empty str without '/'"):
        Worker(bad, Learner)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_intensity_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(SpecError, match=r"Supervisor 'rl': intensity=.* allowed: an int >= 0"):
        Supervisor("rl", intensity=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -5.0, float("inf"), float("nan"), "5"])
def test_period_must_be_positive(bad: object) -> None:
    with pytest.raises(SpecError, match=r"period=.* allowed: a positive number of seconds"):
        Supervisor("rl", period=bad)  # type: ignore[arg-type]


def test_unknown_strategy_lists_the_allowed_ones() -> None:
    with pytest.raises(
        SpecError,
        match=r"strategy='simple_one_for_one'.*'one_for_one', "
        r"'one_for_all', 'rest_for_one', 'escalate'",
    ):
        Supervisor("rl", strategy="simple_one_for_one")  # type: ignore[arg-type]


def test_unknown_restart_type_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"Worker 'w': restart='sometimes'.*'permanent'"):
        Worker("w", Learner, restart="sometimes")  # type: ignore[arg-type]


def test_significant_permanent_child_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"Worker 'w': significant=True .*use restart=TRANSIENT"):
        Worker("w", Learner, significant=True)


def test_significant_child_under_auto_shutdown_never_is_rejected_on_the_parent() -> None:
    child = Worker("w", Learner, restart=TEMPORARY, significant=True)
    with pytest.raises(SpecError, match=r"Worker 'rl/w': significant=True .*auto_shutdown=NEVER"):
        Supervisor("rl", children=[child])
    assert Supervisor("rl", auto_shutdown=ANY_SIGNIFICANT, children=[child]).children == (child,)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "soon", None, True])
def test_bad_shutdown_is_rejected(bad: object) -> None:
    with pytest.raises(
        SpecError, match=r"shutdown=.* allowed: BRUTAL_KILL, INFINITY or a positive"
    ):
        Worker("w", Learner, shutdown=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{}, {"gpus": 0}, {"gpus": -1}, {"gpus": 1.5}, {"a-b": 2}, [4]])
def test_bad_shape_is_rejected(bad: object) -> None:
    with pytest.raises(SpecError, match=r"Mesh 'm': shape=.* allowed: a non-empty dict"):
        Mesh("m", Learner, shape=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [42, "not a path", "pkg.mod.Class", Learner()])
def test_actor_must_be_a_class_or_import_path(bad: object) -> None:
    with pytest.raises(SpecError, match=r"actor=.* allowed: an otpmesh.Actor subclass or its imp"):
        Worker("w", bad)  # type: ignore[arg-type]


def test_children_must_be_specs() -> None:
    with pytest.raises(SpecError, match=r"children=.* allowed: Supervisor, Worker or Mesh"):
        Supervisor("rl", children=["learner"])  # type: ignore[list-item]


def test_spec_error_carries_its_parts_as_data() -> None:
    with pytest.raises(SpecError) as info:
        Supervisor("rl", intensity=-1)
    assert (info.value.path, info.value.field, info.value.value) == (
        "Supervisor 'rl'",
        "intensity",
        -1,
    )
    assert isinstance(info.value, ValueError)


def test_strategy_values_are_otps_words() -> None:
    assert [s.value for s in Strategy] == ["one_for_one", "one_for_all", "rest_for_one", "escalate"]


class NotAnActor:
    pass


@pytest.mark.parametrize("spec", [Worker, lambda id, actor: Mesh(id, actor, shape={"gpus": 2})])
def test_an_actor_class_that_is_not_an_otpmesh_actor_is_refused_when_the_spec_is_built(
    spec: Any,
) -> None:
    with pytest.raises(SpecError, match=r"'a': actor=.*NotAnActor.* does not subclass otpmesh.Act"):
        spec("a", NotAnActor)


def _helper() -> None:
    pass


UNSENDABLE = [
    ((lambda: 1,), {}, r"args\[0\]=<function <lambda>.*\(a function is code"),
    ((1, _helper), {}, r"args\[1\]=<function _helper.*\(a function is code"),
    ((), {"fn": str.upper}, r"kwargs\['fn'\]=.*\(a function is code"),
    ((), {"cfg": {"hook": [1, print]}}, r"kwargs\['cfg'\]\['hook'\]\[1\]=.*\(a function is code"),
    ((NotAnActor,), {}, r"args\[0\]=<class .*\(a class is code"),
    ((object(),), {}, r"args\[0\]=<object .*\(a builtins.object is not data"),
    (({1, 2},), {}, r"args\[0\]=\{1, 2\}.*\(a builtins.set is not data"),
    (({(1, 2): 3, print: 4},), {}, r"args\[0\] key <built-in function print>="),
]


@pytest.mark.parametrize(("args", "kwargs", "match"), UNSENDABLE)
def test_arguments_that_cannot_travel_are_refused_when_the_spec_is_built_naming_them(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(SpecError, match=r"^Worker 'a': " + match):
        Worker("a", Learner, args=args, kwargs=kwargs)
    with pytest.raises(SpecError, match=r"^Mesh 'm': " + match):
        Mesh("m", Learner, args=args, kwargs=kwargs)


def test_an_open_file_is_refused_as_an_argument(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as f, pytest.raises(SpecError, match="an open file belongs"):
        Worker("a", Learner, args=(f,))


def test_data_arguments_are_accepted_when_the_spec_is_built() -> None:
    import numpy
    import torch

    class Colour(enum.IntEnum):
        RED = 1

    data = (
        None,
        True,
        2**40,
        1.5,
        "s",
        b"b",
        bytearray(b"x"),
        [1, (2, 3), {"k": [None]}],
        {1: "int keys", "s": ("tuple",)},
        Colour.RED,
        torch.zeros(2),
        numpy.arange(3),
        otpmesh.ValueMesh({"x": 2}, [1, 2]),
        otpmesh.ActorCrash("E", "m"),
    )
    Worker("a", Learner, args=data, kwargs={"lr": 0.1, "shape": [1, 2]})


def test_the_spec_check_never_refuses_what_the_wire_carries() -> None:
    """_core/_sendable.py accepts by type what the codec carries (it cannot import it): each
    value it refuses, the codec refuses too, and each value the codec carries it accepts."""
    import numpy
    import torch

    from otpmesh._core._sendable import first_unsendable
    from otpmesh._wire import _codec

    values: list[Any] = [
        1, -(2**63), 2.5, "x", b"y", bytearray(b"z"), memoryview(b"w"), None, [1, [2]],
        (1, (2,)), {"a": 1}, {1: 2}, torch.ones(2, 2), numpy.zeros(3),
        otpmesh.ValueMesh({"x": 1}, [1]), otpmesh.ProcessExit(1, "g"), otpmesh.Hung("e", 1, "k"),
        object(), print, _helper, NotAnActor, {1}, frozenset(), complex(1, 2), Path("."), range(3),
        type, [object()], {"k": (object(),)}, enum.Enum("E", "a").a,
    ]  # fmt: skip
    for value in values:
        try:
            _codec.pack(value)
            carried = True
        except otpmesh.EncodeError:
            carried = False
        accepted = first_unsendable((value,), {}) is None
        assert accepted == carried, value


def test_a_spec_is_data_an_owner_can_be_given_as_an_argument() -> None:
    replicas = Mesh("replicas", Learner, shape={"procs": 2})
    assert Worker("svc", Learner, args=(replicas,), kwargs={"sub": [replicas]}).args == (replicas,)


def test_a_large_argument_is_checked_within_a_bound() -> None:
    Worker("a", Learner, args=([*range(1_000_000), print],))  # past the bound: left to the codec
