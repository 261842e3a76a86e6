"""Two apps in one controller: a second tree whose root id is already running is refused at its
start (naming the id), and each app's ``stacks()`` shows its own actors only."""

from __future__ import annotations

import pytest

import otpmesh
from otpmesh import Supervisor, Worker
from tests.actors import Member
from tests.conftest import run_trio


def test_a_second_start_with_a_running_root_id_is_refused_and_the_first_keeps_restarting() -> None:
    tree = Supervisor("job", children=[Worker("c", Member)])

    async def body() -> None:
        async with otpmesh.start(tree) as first:
            with pytest.raises(otpmesh.SupervisorError, match="root is 'job' is already running"):
                async with otpmesh.start(tree):
                    pytest.fail("the second tree started")
            child = first.actor("job/c")
            with pytest.raises(otpmesh.ActorError):
                await child.crash()
            await first.settled()
            assert await child.ping() == "job/c"  # restarted: the first tree is intact
            assert first.which_children("job")[0].incarnation == 2

    run_trio(body, timeout=60)


def test_each_apps_stacks_show_its_own_actors_only() -> None:
    async def body() -> None:
        a_tree = Supervisor("a", children=[Worker("w", Member)])
        b_tree = Supervisor("b", children=[Worker("w", Member)])
        async with (
            otpmesh.start(a_tree, placement="local") as a,
            otpmesh.start(b_tree, placement="local") as b,
        ):
            assert sorted((await a.stacks()).actors) == ["a/w"]
            assert sorted((await b.stacks()).actors) == ["b/w"]
            assert sorted((await a.stacks("a/w")).actors) == ["a/w"]
            with pytest.raises(ValueError, match="'b/w' is not in this app"):
                await a.stacks("b/w")

    run_trio(body, timeout=60)
