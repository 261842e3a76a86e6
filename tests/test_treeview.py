"""The tree view (what `otpmesh run` draws) is a pure model of log entries: fed the entries a
supervisor writes, it says each node's state, incarnation, restarts and last exit."""

from __future__ import annotations

import io

import trio
from rich.console import Console

import otpmesh
from otpmesh import (
    ONE_FOR_ALL,
    ONE_FOR_ONE,
    REST_FOR_ONE,
    TEMPORARY,
    TRANSIENT,
    ActorCrash,
    LogEntry,
    LogKind,
    Mesh,
    Supervisor,
    Worker,
)
from otpmesh._cli._screen import OutputTail, fit, render, tree_table
from otpmesh._cli._treeview import TreeView
from otpmesh._core._outline import outline
from otpmesh._core._reasons import Reported
from tests.actors import Member

TREE = Supervisor(
    "rl",
    strategy=REST_FOR_ONE,
    intensity=3,
    period=60.0,
    children=[
        Worker("learner", Member),
        Mesh("rollouts", Member, shape={"gpus": 2}, strategy=ONE_FOR_ONE, intensity=4, period=60.0),
    ],
)
CRASH = ActorCrash("ValueError", "bad batch")


def _e(
    kind: LogKind, path: str, child: str | None = None, inc: int | None = None, why: object = None
) -> LogEntry:
    return LogEntry(0.0, kind, path, child, inc, why)


def _started() -> list[LogEntry]:
    """What the supervisors log when TREE starts."""
    return [
        _e(LogKind.CHILD_STARTED, "rl", "learner", 1),
        _e(LogKind.CHILD_STARTED, "rl/rollouts", "0", 1),
        _e(LogKind.CHILD_STARTED, "rl/rollouts", "1", 1),
        _e(LogKind.SUPERVISOR_STARTED, "rl/rollouts"),
        _e(LogKind.CHILD_STARTED, "rl", "rollouts", 1),
        _e(LogKind.SUPERVISOR_STARTED, "rl"),
    ]


def _view(entries: list[LogEntry], tree: Supervisor | Mesh = TREE) -> TreeView:
    view = TreeView(tree)
    for entry in entries:
        view.feed(entry)
    return view


def _states(view: TreeView) -> dict[str, tuple[str, int | None, int]]:
    return {p: (n.state, n.incarnation, n.restarts) for p, n in view.nodes.items()}


def test_a_tree_not_started_yet_is_all_starting() -> None:
    view = TreeView(TREE)
    assert list(view.nodes) == ["rl", "rl/learner", "rl/rollouts", "rl/rollouts/0", "rl/rollouts/1"]
    assert {n.state for n in view.nodes.values()} == {"starting"}


def test_a_started_tree_is_all_running_at_incarnation_one() -> None:
    assert _states(_view(_started())) == {
        "rl": ("running", None, 0),
        "rl/learner": ("running", 1, 0),
        "rl/rollouts": ("running", 1, 0),
        "rl/rollouts/0": ("running", 1, 0),
        "rl/rollouts/1": ("running", 1, 0),
    }


def test_a_crashed_actor_is_restarting_then_running_again_with_its_exit_kept() -> None:
    view = _view([*_started(), _e(LogKind.CHILD_EXITED, "rl/rollouts", "1", 1, CRASH)])
    assert view["rl/rollouts/1"].state == "restarting"
    view.feed(_e(LogKind.CHILD_STARTED, "rl/rollouts", "1", 2))
    node = view["rl/rollouts/1"]
    assert (node.state, node.incarnation, node.restarts) == ("running", 2, 1)
    assert node.last_exit == CRASH
    assert view["rl/rollouts/0"].restarts == 0


def test_rest_for_one_siblings_stopped_for_a_restart_show_restarting_not_stopped() -> None:
    view = _view(
        [
            *_started(),
            _e(LogKind.CHILD_EXITED, "rl", "learner", 1, CRASH),
            _e(LogKind.CHILD_TERMINATED, "rl/rollouts", "1", 1, "shutdown"),
            _e(LogKind.CHILD_TERMINATED, "rl/rollouts", "0", 1, "shutdown"),
            _e(LogKind.SUPERVISOR_EXITED, "rl/rollouts", why="shutdown"),
            _e(LogKind.CHILD_TERMINATED, "rl", "rollouts", 1, "shutdown"),
        ]
    )
    assert view["rl/learner"].state == "restarting"
    assert view["rl/rollouts"].state == "restarting"
    assert view["rl/rollouts"].last_exit is None  # stopped by its supervisor: not a failure
    view.feed(_e(LogKind.CHILD_STARTED, "rl", "learner", 2))
    for rank in "01":
        view.feed(_e(LogKind.CHILD_STARTED, "rl/rollouts", rank, 1))
    view.feed(_e(LogKind.SUPERVISOR_STARTED, "rl/rollouts"))
    view.feed(_e(LogKind.CHILD_STARTED, "rl", "rollouts", 2))
    states = _states(view)
    assert states["rl/learner"] == ("running", 2, 1)
    assert states["rl/rollouts"] == ("running", 2, 1)
    assert states["rl/rollouts/0"] == ("running", 1, 1)  # a new mesh instance counts from 1


def test_a_supervisor_that_reaches_its_intensity_gave_up_and_its_children_are_stopped() -> None:
    view = _view(
        [
            *_started(),
            _e(LogKind.CHILD_EXITED, "rl/rollouts", "0", 1, CRASH),
            _e(LogKind.RESTART_INTENSITY_REACHED, "rl/rollouts", "0", 1, CRASH),
            _e(LogKind.CHILD_TERMINATED, "rl/rollouts", "1", 1, "shutdown"),
        ]
    )
    assert view["rl/rollouts"].state == "gave up"
    assert view["rl/rollouts/0"].state == "exited"  # no restart will come
    assert view["rl/rollouts/1"].state == "stopped"
    view.feed(_e(LogKind.SUPERVISOR_EXITED, "rl/rollouts", why="shutdown"))
    assert view["rl/rollouts"].state == "gave up"  # its normal exit does not hide why
    view.feed(_e(LogKind.SUPERVISOR_EXITED, "rl", why=("shutdown", "gave up")))
    assert view["rl"].state == "stopped"


def test_restart_types_decide_whether_an_exit_is_restarting_or_exited() -> None:
    tree = Supervisor(
        "s",
        strategy=ONE_FOR_ALL,
        children=[
            Worker("t", Member, restart=TRANSIENT),
            Worker("tmp", Member, restart=TEMPORARY),
            Worker("p", Member),
        ],
    )
    start = [_e(LogKind.CHILD_STARTED, "s", c, 1) for c in ("t", "tmp", "p")]
    view = _view([*start, _e(LogKind.CHILD_EXITED, "s", "t", 1, "normal")], tree)
    assert view["s/t"].state == "exited"
    view = _view([*start, _e(LogKind.CHILD_EXITED, "s", "t", 1, CRASH)], tree)
    assert view["s/t"].state == "restarting"
    view = _view([*start, _e(LogKind.CHILD_EXITED, "s", "tmp", 1, CRASH)], tree)
    assert view["s/tmp"].state == "exited"
    view = _view([*start, _e(LogKind.CHILD_EXITED, "s", "p", 1, "normal")], tree)
    assert view["s/p"].state == "restarting"


def test_start_failures_ignores_killed_children_and_faults_are_shown() -> None:
    view = _view(
        [
            _e(LogKind.START_FAILED, "rl", "learner", 1, CRASH),
            _e(LogKind.START_IGNORED, "rl/rollouts", "0", 1),
            _e(LogKind.FAULT_INJECTED, "rl/rollouts", "1", None, "kill rl/rollouts/1"),
            _e(LogKind.CHILD_TERMINATED, "rl/rollouts", "1", 1, "killed"),
        ]
    )
    assert view["rl/learner"].state == "start failed"
    assert view["rl/learner"].last_exit == CRASH
    assert view["rl/rollouts/0"].state == "ignored"
    assert (view["rl/rollouts/1"].faults, view["rl/rollouts/1"].last_exit) == (1, "killed")


def test_a_dynamic_child_appears_under_its_supervisor() -> None:
    view = _view([*_started(), _e(LogKind.CHILD_STARTED, "rl", "eval", 1)])
    assert view["rl"].children == ["rl/learner", "rl/rollouts", "rl/eval"]
    assert (view["rl/eval"].kind, view["rl/eval"].state) == ("child", "running")


def test_intensity_counts_the_restarts_within_the_period_of_the_most_allowed() -> None:
    view = _view(_started())
    for t in (1.0, 2.0, 50.0):
        crash = _e(LogKind.CHILD_EXITED, "rl/rollouts", "0", 1, CRASH)
        view.feed(LogEntry(t, crash.kind, crash.path, crash.child, crash.incarnation, CRASH))
    assert view["rl/rollouts"].intensity_used(50.0) == "3/4 in 60s"
    assert view["rl/rollouts"].intensity_used(62.5) == "1/4 in 60s"  # two left the window
    assert view["rl"].intensity_used(50.0) == "0/3 in 60s"
    assert view["rl/learner"].intensity_used(50.0) == ""


def test_a_view_built_from_an_outline_reads_reported_reasons_as_their_words() -> None:
    view = TreeView(outline(TREE))
    for entry in _started():
        view.feed(entry)
    view.feed(_e(LogKind.CHILD_EXITED, "rl", "learner", 1, Reported("crashed with X", False)))
    assert view["rl/learner"].state == "restarting"
    assert view.lines()[2].endswith("crashed with X")
    view.feed(_e(LogKind.CHILD_EXITED, "rl/rollouts", "0", 1, Reported("stopped", True)))
    assert view["rl/rollouts/0"].state == "restarting"  # permanent: restarted even so
    assert [row[0] for row in view.table()[1:]] == [row[0] for row in _view([]).table()[1:]]


def test_the_table_draws_the_tree_with_kinds_states_and_last_exits() -> None:
    view = _view(
        [
            *_started(),
            _e(LogKind.CHILD_EXITED, "rl/rollouts", "1", 1, CRASH),
            _e(LogKind.CHILD_STARTED, "rl/rollouts", "1", 2),
        ]
    )
    assert view.lines() == [
        "NAME          KIND                     STATE    INC  RESTARTS  INTENSITY   LAST EXIT",
        "rl            supervisor rest_for_one  running       0         0/3 in 60s",
        "├── learner   worker Member            running  #1   0",
        "└── rollouts  mesh gpus=2 one_for_one  running  #1   0         1/4 in 60s",
        "    ├── 0     worker Member            running  #1   0",
        "    └── 1     worker Member            running  #2   1                     "
        "crashed with ValueError: bad batch",
    ]
    assert view.summary() == "rl running: 3/3 actors running, 1 actor restarts, 8 events in 0.0 s"
    view.feed(_e(LogKind.FAULT_INJECTED, "rl", "learner", None, "crash rl/learner"))
    assert view.lines()[0].split() == [
        "NAME", "KIND", "STATE", "INC", "RESTARTS", "INTENSITY", "FAULTS", "LAST", "EXIT"
    ]  # fmt: skip
    assert view.lines()[2].split()[-1] == "1"


def test_a_real_tree_log_leaves_every_actor_running_at_its_last_incarnation() -> None:
    async def main() -> tuple[TreeView, list[LogEntry]]:
        async with otpmesh.start(TREE, placement="local") as app:
            for path in ("rl/rollouts/1", "rl/learner", "rl/rollouts/0"):
                await otpmesh.chaos.crash(app, path)
                await app.settled()
            view = TreeView(TREE)
            for entry in app.events:
                view.feed(entry)
            return view, list(app.events)

    view, log = trio.run(main)
    assert {p: n.state for p, n in view.nodes.items()} == dict.fromkeys(view.nodes, "running")
    # rank 1: its own crash; the learner's crash restarts the learner and, rest_for_one, the
    # whole mesh; then rank 0's own crash
    assert [view[p].restarts for p in view.nodes] == [0, 1, 1, 2, 2]
    last_start = {e.child_path: e.incarnation for e in log if e.kind is LogKind.CHILD_STARTED}
    assert {p: view[p].incarnation for p in last_start} == last_start
    assert view.faults() == 3


def test_a_frame_keeps_the_top_and_the_last_lines_of_each_section_that_fit() -> None:
    events = [f"event {i}" for i in range(20)]
    sections = fit(2, [("recent events", events), ("output", ["out 1", "out 2"])], rows=12)
    assert sections == [
        ("recent events", ["event 17", "event 18", "event 19"]),
        ("output", ["out 1", "out 2"]),
    ]  # 2 rows of top, a blank line and a title each, the last row free
    assert fit(2, [("empty", []), ("recent events", events)], rows=None) == [
        ("recent events", events)
    ]
    assert fit(2, [("recent events", events)], rows=4) == []  # no room: no section


def test_the_rendered_frame_shows_the_tree_a_line_per_node_and_cuts_only_the_last_exit() -> None:
    view = _view([*_started(), _e(LogKind.CHILD_EXITED, "rl/rollouts", "1", 1, CRASH)])
    table = tree_table(view.table())
    frame = render("otpmesh run x", "    Ctrl-C", view.summary(), table, [("recent events", ["e"])])
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(frame)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines == [
        "otpmesh run x    Ctrl-C",
        "rl running: 2/3 actors running, 0 actor restarts, 7 events in 0.0 s",
        "NAME          KIND                     STATE       INC  RESTARTS  INTENSITY   L…",
        "rl            supervisor rest_for_one  running          0         0/3 in 60s",
        "├── learner   worker Member            running     #1   0",
        "└── rollouts  mesh gpus=2 one_for_one  running     #1   0         1/4 in 60s",
        "    ├── 0     worker Member            running     #1   0",
        "    └── 1     worker Member            restarting  #1   0                     c…",
        "",
        "recent events",
        "e",
    ]


def test_the_output_tail_keeps_whole_lines_written_in_pieces() -> None:
    tail = OutputTail(keep=2)
    tail.write("[a/0] one\n[a/0] tw")
    tail.write("o\n[a/1] three\npartial")
    assert list(tail.lines) == ["[a/0] two", "[a/1] three"]
