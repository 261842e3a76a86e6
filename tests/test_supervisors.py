"""The ready-made trees in supervisors/: their shape, and each demo run as a user would run it.

Each demo prints '== title' sections of supervision events; the checks below read those events
back and pin the strategy's effect: who exited, who was stopped, who was started, in what order,
and who was left alone. The demos run over real worker processes (as scripts, in a subprocess)
and in-process (placement="local"): the same events must come out of both.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import otpmesh
from otpmesh import ALL_FOR_ONE, ONE_FOR_ALL, ONE_FOR_ONE, REST_FOR_ONE, Mesh, Supervisor, Worker
from supervisors import data_parallel, pipeline_stages, rl_pipeline, serving_replicas
from tests.conftest import run_trio

REPO = Path(__file__).resolve().parent.parent
MODULES = [rl_pipeline, data_parallel, pipeline_stages, serving_replicas]

# ---- the trees ---------------------------------------------------------------------------------


def child_ids(spec: Supervisor | Mesh) -> list[str]:
    return [c.id for c in (spec.as_supervisor() if isinstance(spec, Mesh) else spec).children]


def test_rl_pipeline_is_rest_for_one_over_learner_reward_then_rollouts() -> None:
    tree = rl_pipeline.tree
    assert isinstance(tree, Supervisor)
    assert (tree.id, tree.strategy) == ("rl", REST_FOR_ONE)
    assert child_ids(tree) == ["learner", "reward", "rollouts"]
    learner, reward, rollouts = tree.children
    assert isinstance(learner, Worker) and learner.actor is rl_pipeline.Learner
    assert isinstance(reward, Worker) and reward.actor is rl_pipeline.RewardModel
    assert isinstance(rollouts, Mesh) and rollouts.actor is rl_pipeline.Rollout
    assert rollouts.strategy is ONE_FOR_ONE
    assert child_ids(rollouts) == ["0", "1", "2", "3"]


def test_data_parallel_is_an_all_for_one_mesh_of_trainers() -> None:
    tree = data_parallel.tree
    assert isinstance(tree, Mesh)
    assert tree.strategy is ALL_FOR_ONE is ONE_FOR_ALL
    assert dict(tree.shape) == {"gpus": 4}
    assert child_ids(tree) == ["0", "1", "2", "3"]
    assert child_ids(data_parallel.make_tree(gpus=8)) == [str(r) for r in range(8)]


def test_pipeline_stages_is_rest_for_one_over_stages_in_data_flow_order() -> None:
    tree = pipeline_stages.tree
    assert isinstance(tree, Supervisor)
    assert tree.strategy is REST_FOR_ONE
    assert child_ids(tree) == ["stage0", "stage1", "stage2", "stage3"]
    assert all(isinstance(c, Worker) and c.actor is pipeline_stages.Stage for c in tree.children)
    assert [c.args for c in tree.children if isinstance(c, Worker)] == [(0,), (1,), (2,), (3,)]
    assert child_ids(pipeline_stages.make_tree(stages=2)) == ["stage0", "stage1"]


def test_serving_replicas_is_one_for_one_with_intensity_scaled_to_replicas() -> None:
    tree = serving_replicas.tree
    assert isinstance(tree, Mesh)
    assert tree.strategy is ONE_FOR_ONE
    assert child_ids(tree) == ["0", "1", "2", "3"]
    assert tree.intensity == 8 > Supervisor("default").intensity
    assert serving_replicas.make_tree(replicas=16).intensity == 32


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_module_tree_is_make_tree_with_its_defaults(module: ModuleType) -> None:
    assert module.make_tree() == module.tree


# ---- reading a demo's output -------------------------------------------------------------------

_EVENT = re.compile(r"^\s+\d+\.\d ms\s+(?P<kind>[a-z_]+)\s+(?P<path>\S+)")

Events = list[tuple[str, str]]


def section(out: str, title: str) -> Events:
    """The (kind, path) events printed under the '== <title>...' heading."""
    events: Events = []
    inside = False
    for line in out.splitlines():
        if line.startswith("== "):
            inside = line.startswith(f"== {title}")
        elif inside and (match := _EVENT.match(line)):
            events.append((match["kind"], match["path"]))
    assert events, f"no events under '== {title}' in:\n{out}"
    return events


def under(events: Events, parent: str) -> Events:
    """Only `parent`'s own steps on its direct children (not a child supervisor's own events)."""
    depth = parent.count("/") + 1
    return [
        (k, p)
        for k, p in events
        if k.startswith("child_") and p.startswith(parent + "/") and p.count("/") == depth
    ]


def paths(events: Events) -> set[str]:
    return {p for _, p in events}


# ---- what each demo must show ------------------------------------------------------------------


def check_rl_pipeline(out: str) -> None:
    assert section(out, "rollout 2") == [
        ("child_exited", "rl/rollouts/2"),
        ("child_started", "rl/rollouts/2"),
    ]
    reward = section(out, "the reward model")
    assert "rl/learner" not in paths(reward)
    assert under(reward, "rl") == [
        ("child_exited", "rl/reward"),
        ("child_terminated", "rl/rollouts"),
        ("child_started", "rl/reward"),
        ("child_started", "rl/rollouts"),
    ]
    assert "learner policy: v2 (kept)" in out
    assert under(section(out, "the learner"), "rl") == [
        ("child_exited", "rl/learner"),
        ("child_terminated", "rl/rollouts"),  # newest first
        ("child_terminated", "rl/reward"),
        ("child_started", "rl/learner"),  # then in start order
        ("child_started", "rl/reward"),
        ("child_started", "rl/rollouts"),
    ]
    assert "learner policy: v0 (back to its checkpoint)" in out
    stop = under(section(out, "stop"), "rl")
    assert stop == [("child_terminated", f"rl/{c}") for c in ("rollouts", "reward", "learner")]


def check_data_parallel(out: str) -> None:
    steps = section(out, "rank 2 fails")
    assert steps[0] == ("child_exited", "dp/2")
    # A mesh stops its members all at once (docs/supervision.md): they end in any order.
    assert sorted(steps[1:4]) == [("child_terminated", f"dp/{rank}") for rank in (0, 1, 3)]
    assert steps[4:] == [("child_started", f"dp/{rank}") for rank in range(4)]
    assert "(step, weight) per rank: [(2, 3.375), (2, 3.375), (2, 3.375), (2, 3.375)]" in out


def check_pipeline_stages(out: str) -> None:
    assert section(out, "stage1 fails") == [
        ("child_exited", "pipeline/stage1"),
        ("child_terminated", "pipeline/stage3"),
        ("child_terminated", "pipeline/stage2"),
        ("child_started", "pipeline/stage1"),
        ("child_started", "pipeline/stage2"),
        ("child_started", "pipeline/stage3"),
    ]
    assert "stream position per stage: [3, 0, 0, 0]" in out
    assert section(out, "the last stage") == [
        ("child_exited", "pipeline/stage3"),
        ("child_started", "pipeline/stage3"),
    ]


def check_serving_replicas(out: str) -> None:
    for rank in (1, 3):
        title = "a poison request" if rank == 1 else "a second poison request"
        assert section(out, title) == [
            ("child_exited", f"replicas/{rank}"),
            ("child_started", f"replicas/{rank}"),
        ]
    # .choose spreads the load as it sees fit; what matters is that only replica 1 lost its state.
    before, after = re.findall(r"requests served per replica: (\[.*\])", out)
    assert ast.literal_eval(after) == [
        n if r != 1 else 0 for r, n in enumerate(ast.literal_eval(before))
    ]
    assert all(f"hello... (replica {rank})" in out for rank in range(4))


CHECKS: dict[ModuleType, Callable[[str], None]] = {
    rl_pipeline: check_rl_pipeline,
    data_parallel: check_data_parallel,
    pipeline_stages: check_pipeline_stages,
    serving_replicas: check_serving_replicas,
}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_demo_runs_as_a_script_over_worker_processes(module: ModuleType) -> None:
    script = Path(module.__file__ or "").relative_to(REPO)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    CHECKS[module](done.stdout)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_demo_shows_the_same_supervision_in_process(
    module: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    run_trio(lambda: module.main("local"), timeout=30)
    CHECKS[module](capsys.readouterr().out)


def test_tree_from_an_imported_module_runs_over_worker_processes() -> None:
    # Workers import the actor classes by module name (supervisors.rl_pipeline), not by file.
    async def body() -> None:
        async with otpmesh.start(rl_pipeline.make_tree(rollout_gpus=2)) as app:
            assert await rl_pipeline.train_step(app, 1) == 1
            assert (await app.mesh("rl/rollouts").policy_version()).values() == [1, 1]

    run_trio(body)


# The code blocks of docs/supervision.md run in tests/test_docs.py, with every other doc's.
