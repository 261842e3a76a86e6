"""How a start that fails is reported: the user's frames printed where the constructor or
on_start raised, and arguments the wire refuses named with the child."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import otpmesh
from otpmesh import Supervisor, Worker
from tests.actors import Echo
from tests.conftest import run_program, run_trio


def test_a_constructor_that_raises_is_printed_with_the_users_frames(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    done = run_program(
        program,
        textwrap.dedent(
            """
            import otpmesh

            def load(path):
                raise FileNotFoundError(path)

            class Learner(otpmesh.Actor):
                def __init__(self, path):
                    self.weights = load(path)

            async def main():
                tree = otpmesh.Supervisor("rl", children=[
                    otpmesh.Worker("learner", Learner, args=("ckpt.pt",)),
                ])
                async with otpmesh.start(tree):
                    pass

            if __name__ == "__main__":
                otpmesh.run(main)
            """
        ),
    )
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert "rl/learner failed to start" in err, err
    assert f'File "{program}", line 9, in __init__' in err, err  # the user's frames...
    assert f'File "{program}", line 5, in load' in err, err
    assert "_host.py" not in err and "_node.py" not in err, err  # ...and none of otpmesh's
    assert err.rstrip().endswith("failed to start (crashed with FileNotFoundError: ckpt.pt)"), err


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = (value,)
    return value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (_nested(10), "nested more than 8 levels"),  # the wire's limit (_codec.MAX_NESTING)
        (2**70, "Integer value out of range"),  # msgpack's integers are 64-bit
    ],
)
def test_arguments_the_wire_refuses_fail_the_start_naming_the_child_and_the_argument(
    value: object, why: str
) -> None:
    """Values that are data, so the spec took them, but that only the codec refuses."""
    tree = Supervisor("s", children=[Worker("z", Echo), Worker("a", Echo, kwargs={"tag": value})])

    async def body() -> None:
        with pytest.raises(otpmesh.SupervisorError, match="child a failed to start") as caught:
            async with otpmesh.start(tree):
                pass
        crash = caught.value.reason[1][2]  # type: ignore[index]
        assert crash.type_name == "EncodeError"
        assert crash.message.startswith("kwargs['tag'] cannot travel to the actor: ")
        assert why in crash.message

    run_trio(body)
