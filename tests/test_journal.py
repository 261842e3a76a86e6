"""The takeover journal without processes: what its snapshot keeps (every run folds to the same
state after a compaction as before), that a journal of thousands of restarts stays bounded, that
a reader never sees half a compaction, and how torn, damaged and unknown lines are read."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from otpmesh import Supervisor, TakeoverError, Worker
from otpmesh._controller._lastrun import last_run
from otpmesh._controller._takeover import carried_times
from otpmesh._core._supervisor import SupervisorCore
from otpmesh._core._supevents import ChildExited, ChildStarted, StartChild
from otpmesh._runtime._journal import Journal, read_journal
from otpmesh._runtime._journalstate import fold, parse
from otpmesh._runtime._statedir import EPOCH, JOURNAL, bump_epoch, open_state_dir
from tests.test_takeover import Plain

APP = {"app": 100, "epoch": 1, "secret": "ab"}


def _proc(proc_id: str) -> dict[str, Any]:
    return {"proc": proc_id, "pid": 7, "addr": "unix:x", "rank": 0, "coords": {"procs": 0}}


def _actor(path: str, incarnation: int, proc_id: str = "p1") -> dict[str, Any]:
    return {"actor": path, "incarnation": incarnation, "proc": proc_id}


def _restart(sup: str, at: float, window: int) -> dict[str, Any]:
    return {"restart": sup, "at": at, "window": window}


def _compacted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return fold(records).records()


def test_the_snapshot_keeps_live_processes_last_incarnations_and_the_restart_window() -> None:
    records = [
        {"chaos": "controller", "pid": 9, "step": 3, "index": 0, "plan": "p"},
        {"group": "g", "epoch": 1},
        APP,
        _proc("p1"),
        _proc("p2"),
        _actor("s/a", 1),
        _actor("s/b", 1, "p2"),
        {"exited": "p2"},
        _actor("s/b", 2),
        _restart("s", 10.0, 1),
        _restart("s", 20.0, 2),
        _restart("s", 90.0, 1),  # the first two fell out of the period
        {"group": "g", "epoch": 2},
    ]
    snapshot = _compacted(records)
    assert snapshot == [
        records[0],
        {"group": "g", "epoch": 2},
        APP,
        _proc("p1"),
        _actor("s/a", 1),
        _actor("s/b", 2),
        {"restart": "s", "at": 90.0},
    ]
    run = last_run(snapshot)
    assert run.actors == {"s/a": (1, "p1"), "s/b": (2, "p1")}
    assert list(run.procs) == ["p1"] and run.restarts == {"s": [(90.0, None)]}


def test_a_snapshot_after_a_takeover_keeps_the_new_run_and_every_runs_marks() -> None:
    old = [APP, _proc("p1"), _actor("s/a", 3), {"chaos": "controller", "pid": 100}]
    new = [{**APP, "app": 200, "epoch": 2}, _proc("p1"), _actor("s/a", 3), _restart("s", 5.0, 1)]
    snapshot = _compacted(old + new)
    assert snapshot[0] == {"chaos": "controller", "pid": 100}
    assert last_run(snapshot) == last_run(old + new)
    assert last_run(snapshot).app == new[0]


def test_a_stopped_run_compacts_to_its_stop() -> None:
    records = [APP, _proc("p1"), _actor("s/a", 1), {"stopped": 100}]
    assert _compacted(records) == [{"stopped": 100}]
    assert last_run(_compacted(records)).app is None


_paths = st.sampled_from(["s/a", "s/b", "t/c"])
_records = st.one_of(
    st.builds(lambda pid: {**APP, "app": pid}, st.integers(1, 3)),
    st.builds(lambda pid: {"stopped": pid}, st.integers(1, 3)),
    st.builds(_proc, st.sampled_from(["p1", "p2", "p3"])),
    st.builds(lambda p: {"exited": p}, st.sampled_from(["p1", "p2", "p4"])),
    st.builds(_actor, _paths, st.integers(1, 9), st.sampled_from(["p1", "p2"])),
    st.builds(_restart, st.sampled_from(["s", "t"]), st.floats(0, 1e9), st.integers(1, 4)),
    st.builds(lambda p: {"restart": p, "at": 1.0}, st.sampled_from(["s", "t"])),
    st.builds(lambda g, e: {"group": g, "epoch": e}, st.sampled_from(["g", "h"]), st.integers()),
    st.builds(lambda i: {"chaos": "controller", "index": i}, st.integers(0, 3)),
    st.builds(
        lambda rank, n, p: {"agent_token": rank, "next": n, **({"presented": p} if p else {})},
        st.integers(0, 2),
        st.sampled_from(["aa", "bb", "cc"]),
        st.sampled_from(["", "aa", "dd"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_records, max_size=40), st.lists(_records, max_size=10))
def test_any_journal_folds_to_the_same_state_after_compaction(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    # A compaction at any point: what is appended after it folds as it would have anyway.
    assert fold(_compacted(before) + after) == fold(before + after)
    assert last_run(_compacted(before) + after) == last_run(before + after)


@pytest.mark.parametrize(("now", "gives_up"), [(0.0, True), (45.0, False)])
def test_a_compacted_restart_history_gives_the_standby_the_same_intensity_verdict(
    now: float, gives_up: bool
) -> None:
    # intensity 2 in 60 s; the active restarted at -100, -50 and -10 (wall clock, from its
    # cores' windows). At 0 the last two are inside the period: the next restart is one too
    # many; at 45 only -10 is, and the standby restarts.
    records = [APP, _restart("s", -100.0, 1), _restart("s", -50.0, 2), _restart("s", -10.0, 2)]
    spec = Supervisor("s", intensity=2, period=60.0, children=[Worker("a", Plain)])
    for journal in (records, _compacted(records)):
        carried = carried_times(last_run(journal).restarts["s"], False, 0.0, 0.0, 0.0)
        assert _gives_up(spec, carried, now) is gives_up, journal


def _gives_up(spec: Supervisor, carried: tuple[float, ...], now: float) -> bool:
    """Whether a core of `spec` carrying `carried` gives up on a child's crash at `now`."""
    core = SupervisorCore(spec, restarts=carried)
    core.start(now)
    core.handle(ChildStarted("a"), now)
    commands = core.handle(ChildExited("a", 1, "boom"), now)
    return not any(isinstance(c, StartChild) for c in commands)


@pytest.mark.parametrize("step", [-3600.0, 0.0, 3600.0])
def test_a_wall_clock_step_before_the_takeover_does_not_change_the_intensity_verdict(
    step: float,
) -> None:
    # intensity 2 in 60 s; two restarts 10 and 20 s ago by the monotonic clock (then at wall
    # 1000 and 990), then the wall clock steps: the standby on this boot still counts both.
    stamps = [(990.0, 480.0), (1000.0, 490.0)]
    spec = Supervisor("s", intensity=2, period=60.0, children=[Worker("a", Plain)])
    now, wall, mono = 7.0, 1010.0 + step, 500.0
    assert carried_times(stamps, True, now, wall, mono) == (-3.0, -13.0)
    assert _gives_up(spec, carried_times(stamps, True, now, wall, mono), now)
    # On another host (or after a reboot) only the wall clock is left, step and all.
    assert _gives_up(spec, carried_times(stamps, False, now, wall, mono), now) is (step <= 0)


def _started(root: Path, compact_bytes: int = 4096, nursery: trio.Nursery | None = None) -> Journal:
    """A fresh journal in `root` with its app record, as a controller starts one."""
    journal = Journal(root, epoch=bump_epoch(root), compact_bytes=compact_bytes, nursery=nursery)
    journal.append(APP, durable=True)
    return journal


def _restart_cycles(journal: Journal, count: int, first: int = 2) -> None:
    for incarnation in range(first, first + count):
        journal.append(_restart("job/busy", float(incarnation), 1))
        journal.append(_actor("job/busy/churn", incarnation))


def test_a_journal_of_thousands_of_restarts_stays_bounded(tmp_path: Path) -> None:
    root = open_state_dir(tmp_path / "state")
    journal = _started(root, compact_bytes=16 * 1024)
    journal.append(_proc("p1"))
    sizes = []
    for first in range(2, 5002, 500):
        _restart_cycles(journal, 500, first)
        sizes.append((root / JOURNAL).stat().st_size)
    assert max(sizes) < 2 * 16 * 1024, sizes  # 5,000 restarts unbounded: ~500 KB
    assert len(journal.compactions) >= 10
    run = last_run(read_journal(root))
    assert run.actors["job/busy/churn"][0] == 5001 and run.restarts["job/busy"] == [(5001.0, None)]
    mode = stat.S_IMODE((root / JOURNAL).stat().st_mode)
    assert mode == 0o600 and not (root / f"{JOURNAL}.new").exists()
    journal.close()


def _read_while_compacting(root: str, done: Any, seen: Any) -> None:
    last = 0
    while not done.is_set():
        run = last_run(read_journal(Path(root)))  # raises on any torn or mixed line
        assert run.app is not None, "a read without the app record"
        incarnation = run.actors.get("job/busy/churn", (0, ""))[0]
        assert incarnation >= last, (incarnation, last)
        last = incarnation
        seen.value += 1


@pytest.mark.timeout(120)
def test_a_reader_during_compactions_sees_the_old_file_or_the_new_one(tmp_path: Path) -> None:
    root = open_state_dir(tmp_path / "state")
    journal = _started(root)
    ctx = multiprocessing.get_context("spawn")
    done, seen = ctx.Event(), ctx.Value("i", 0)
    reader = ctx.Process(target=_read_while_compacting, args=(str(root), done, seen))
    reader.start()
    try:
        first = 2
        while (seen.value < 50 or len(journal.compactions) < 10) and reader.is_alive():
            _restart_cycles(journal, 20, first)
            first += 20
    finally:
        done.set()
        reader.join(60)
    assert reader.exitcode == 0 and seen.value >= 50
    assert len(journal.compactions) > 10


def test_records_appended_while_a_snapshot_is_written_aside_are_carried_into_it(
    tmp_path: Path,
) -> None:
    root = open_state_dir(tmp_path / "state")

    async def body() -> Journal:
        async with trio.open_nursery() as nursery:
            journal = _started(root, nursery=nursery)
            for first in range(2, 3002, 10):
                _restart_cycles(journal, 10, first)
                await trio.sleep(0)  # the controller's loop runs on while the thread writes
        return journal

    journal = trio.run(body)
    assert journal.compactions and journal.carried > 0  # records carried: appended aside
    assert fold(read_journal(root)) == journal.state  # nothing appended meanwhile was lost
    assert last_run(read_journal(root)).actors["job/busy/churn"][0] == 3001
    journal.close()


def test_a_journal_closed_while_a_snapshot_is_written_keeps_its_last_records(
    tmp_path: Path,
) -> None:
    root = open_state_dir(tmp_path / "state")

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            journal = _started(root, nursery=nursery)
            while not journal.pauses:  # until a compaction starts
                _restart_cycles(journal, 1)
            journal.append({"stopped": 100}, durable=True)
            journal.close()

    trio.run(body)
    assert read_journal(root)[-1] == {"stopped": 100}
    assert not (root / f"{JOURNAL}.new").exists()


def test_a_fenced_controller_does_not_compact_the_journal_over_its_successor(
    tmp_path: Path,
) -> None:
    root = open_state_dir(tmp_path / "state")
    journal = _started(root)
    bump_epoch(root)  # a standby took the directory over
    inode = (root / JOURNAL).stat().st_ino
    _restart_cycles(journal, 200)
    assert (root / JOURNAL).stat().st_ino == inode and not journal.compactions
    assert not (root / f"{JOURNAL}.new").exists() and (root / EPOCH).read_text() == "2\n"


def test_a_replaced_controller_appends_nothing_to_its_successors_journal(
    tmp_path: Path,
) -> None:
    """A controller cut off from most of its hosts acts until its quorum timeout, after a
    standby may have taken its run over: what it appends meanwhile must not land among its
    successor's records (a later takeover would fold them into the new run: a process exit that
    never happened, a restart counted against the new run's intensity). The successor renames a
    snapshot over the journal before its first record, so the old controller's appends go to
    the file it holds open. Before, both appended to one file."""
    root = open_state_dir(tmp_path / "state")
    old = _started(root)
    old.append(_proc("p1"))
    new = Journal(root, epoch=bump_epoch(root), after=read_journal(root))
    standby = {**APP, "app": 200, "epoch": 2}
    new.append(standby, durable=True)
    new.append(_proc("p1"))  # it adopted p1
    old.append({"exited": "p1"})
    old.append(_restart("s", 1.0, 1))
    new.append(_actor("s/a", 2, "p1"))
    after = read_journal(root)
    assert {"exited": "p1"} not in after
    assert after[-3:] == [standby, _proc("p1"), _actor("s/a", 2, "p1")]
    run = last_run(after)
    assert run.app == standby and "p1" in run.procs and "s" not in run.restarts


def _lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_a_torn_last_line_is_read_up_to_and_cut_before_the_next_run_appends(
    tmp_path: Path,
) -> None:
    root = open_state_dir(tmp_path / "state")
    fd = os.open(root / JOURNAL, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, _lines(APP, _proc("p1")) + b'{"actor":"s/a","incarn')
    os.close(fd)
    records = read_journal(root)
    assert records == [APP, _proc("p1")]
    journal = Journal(root, epoch=bump_epoch(root), after=records)
    standby = {**APP, "app": 200, "epoch": 2}
    journal.append(standby, durable=True)  # not glued to the torn line
    assert read_journal(root) == [APP, _proc("p1"), standby]
    assert last_run(read_journal(root)).app == standby


def test_a_record_this_version_does_not_understand_is_an_error() -> None:
    with pytest.raises(TakeoverError, match="line 2 of the journal is a record this version"):
        parse(_lines(APP, {"lease_holder": 3}, _proc("p1")))
    with pytest.raises(TakeoverError, match="line 1 of the journal is a record this version"):
        parse(_lines([1, 2]))  # type: ignore[arg-type]


def test_a_damaged_line_before_the_last_is_an_error_not_skipped() -> None:
    with pytest.raises(TakeoverError, match="line 2 of the journal is not a JSON record"):
        parse(_lines(APP) + b'{"proc": \n' + _lines(_proc("p1")))


def test_a_compaction_that_cannot_write_leaves_the_journal_growing_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = open_state_dir(tmp_path / "state")
    (root / f"{JOURNAL}.new").mkdir()  # in its way, as a full disk would be
    journal = _started(root)
    _restart_cycles(journal, 100)  # ~11 KB: past the bound twice
    assert not journal.compactions and "could not be compacted" in caplog.text
    assert last_run(read_journal(root)).actors["job/busy/churn"][0] == 101
    assert len(read_journal(root)) == 201
