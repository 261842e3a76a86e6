"""The takeover journal when its file system fails it, and when its bytes are not what a
controller wrote: a full file system (a real tmpfs, filled by a dummy file) never makes an
append raise, the journal is cut to a gap that says why (never a partial line in it), one
warning says takeover is unavailable, and once there is room again the journal is written
whole; a torn line in the middle is read up to; a record of the wrong shape is a TakeoverError
that names its line, never a KeyError or a ValueError from a reader."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from otpmesh import TakeoverError
from otpmesh._controller._lastrun import last_run
from otpmesh._runtime._journal import RETRY_FIRST, Journal, read_journal, room
from otpmesh._runtime._journalstate import fold
from otpmesh._runtime._statedir import JOURNAL, bump_epoch, open_state_dir
from tests.test_journal import APP, _actor, _lines, _proc, _restart

UNAVAILABLE = "takeover is unavailable"
WHOLE = "is whole again"


@contextmanager
def small_fs(where: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of `size` (and `inodes` files at most) mounted at `where`, unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a file system to fill) needs root")
    where.mkdir(mode=0o700)
    options = f"size={size},mode=0700" + ("" if inodes is None else f",nr_inodes={inodes}")
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:  # root without CAP_SYS_ADMIN (a container)
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(fs: Path) -> Path:
    """Fill file system `fs` with a dummy file (more of it), to the last byte; the file."""
    dummy = fs / "dummy"
    fd = os.open(dummy, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"x" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return dummy


def whole(root: Path, journal: Journal) -> bool:
    """Whether the journal in `root` folds to what `journal` holds in memory, every line a
    record (no partial line anywhere)."""
    data = (root / JOURNAL).read_bytes()
    return data.endswith(b"\n") and fold(read_journal(root)) == journal.state


def _restarts(journal: Journal, count: int, first: int = 2) -> None:
    for incarnation in range(first, first + count):
        journal.append(_restart("job/busy", float(incarnation), 1))
        journal.append(_actor("job/busy/churn", incarnation))


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_the_room_a_journal_holds_lets_it_append_on_a_full_file_system(tmp_path: Path) -> None:
    with small_fs(tmp_path / "fs", "1m") as fs:
        root = open_state_dir(fs / "state")
        journal = Journal(root, epoch=bump_epoch(root), compact_bytes=64 * 1024)
        journal.append(APP, durable=True)
        fill(fs)
        _restarts(journal, 200)  # ~20 KB, inside the 80 KB it holds
        assert journal.unavailable is None and whole(root, journal)
        assert (root / JOURNAL).stat().st_blocks * 512 >= room(0, 64 * 1024)
        journal.close()


def test_a_full_file_system_makes_takeover_unavailable_once_then_the_journal_catches_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_fs(tmp_path / "fs", "512k") as fs:
        root = open_state_dir(fs / "state")
        journal = Journal(root, epoch=bump_epoch(root), compact_bytes=4096)
        journal.append(APP, durable=True)
        journal.append(_proc("p1"))
        dummy = fill(fs)
        _restarts(journal, 300)  # past its room: a short write, then ENOSPC; nothing raises
        assert journal.unavailable is not None and "a short write" in journal.unavailable
        assert _warnings(caplog, UNAVAILABLE) == 1 and journal.outages == 1
        records = read_journal(root)  # cut to its gap: a standby would start afresh
        assert [next(iter(r)) for r in records] == ["gap"] and last_run(records).app is None
        assert (root / JOURNAL).read_bytes().endswith(b"\n")
        _restarts(journal, 50, 302)  # still unavailable: no second warning, no retry spam
        assert _warnings(caplog, UNAVAILABLE) == 1

        dummy.unlink()
        time.sleep(RETRY_FIRST)  # its back-off (without a nursery it tries on an append)
        _restarts(journal, 1, 352)
        assert journal.unavailable is None and whole(root, journal)
        assert _warnings(caplog, WHOLE) == 1 and _warnings(caplog, UNAVAILABLE) == 1
        run = last_run(read_journal(root))
        assert run.app == APP and list(run.procs) == ["p1"]
        assert run.actors["job/busy/churn"][0] == 352
        journal.close()


def test_the_journal_catches_up_in_the_background_when_the_app_appends_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_fs(tmp_path / "fs", "512k") as fs:
        root = open_state_dir(fs / "state")

        async def body() -> Journal:
            async with trio.open_nursery() as nursery:
                journal = Journal(root, epoch=bump_epoch(root), compact_bytes=4096, nursery=nursery)
                journal.append(APP, durable=True)
                dummy = fill(fs)
                while journal.unavailable is None:
                    _restarts(journal, 10)
                    await trio.sleep(0)
                fill(fs)  # what cutting the journal to its gap freed: the filler takes it too
                await trio.sleep(30)  # tries in the background: the file system stays full
                assert journal.unavailable is not None
                dummy.unlink()
                while journal.unavailable is not None:  # no append: the retry task writes it
                    await trio.sleep(1)
                journal.close()
            return journal

        journal = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
        assert whole(root, journal) and journal.outages == 1
        assert _warnings(caplog, UNAVAILABLE) == 1 and _warnings(caplog, WHOLE) == 1


def test_a_run_that_stops_while_its_journal_is_unavailable_still_says_it_stopped(
    tmp_path: Path,
) -> None:
    with small_fs(tmp_path / "fs", "256k") as fs:
        root = open_state_dir(fs / "state")
        journal = Journal(root, epoch=bump_epoch(root), compact_bytes=4096)
        journal.append(APP, durable=True)
        fill(fs)
        while journal.unavailable is None:
            _restarts(journal, 10)
        journal.append({"stopped": 100}, durable=True)
        journal.close()
        records = read_journal(root)  # a standby ends (StandbyDoneError), as after any stop
        assert "gap" in records[0] and records[-1] == {"stopped": 100}


def test_a_journal_that_cannot_even_be_made_does_not_end_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_fs(tmp_path / "fs", "1m", inodes=8) as fs:
        root = open_state_dir(fs / "state")
        bump_epoch(root)
        dummies = []
        with pytest.raises(OSError, match="No space left"):  # every inode taken
            for n in range(16):
                (fs / f"dummy{n}").touch()
                dummies.append(fs / f"dummy{n}")
        journal = Journal(root, epoch=1, compact_bytes=4096)  # no file: no raise
        journal.append(APP, durable=True)
        assert journal.unavailable is not None and _warnings(caplog, UNAVAILABLE) == 1
        assert "could not say so" in caplog.text and read_journal(root) == []
        dummies.pop().unlink()
        time.sleep(RETRY_FIRST)
        journal.append(_proc("p1"))
        assert journal.unavailable is None and whole(root, journal)
        journal.close()


def test_a_takeover_whose_snapshot_finds_no_room_goes_on_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_fs(tmp_path / "fs", "256k") as fs:
        root = open_state_dir(fs / "state")
        old = Journal(root, epoch=bump_epoch(root), compact_bytes=4096)
        old.append(APP, durable=True)
        old.append(_proc("p1"))
        old.close()
        epoch = bump_epoch(root)
        fill(fs)
        new = Journal(root, epoch=epoch, after=read_journal(root), compact_bytes=4096)
        assert new.unavailable is not None and _warnings(caplog, UNAVAILABLE) == 1
        new.append({**APP, "app": 200, "epoch": epoch}, durable=True)
        assert last_run(read_journal(root)).app is None  # not the old run, half continued
        new.close()


def test_a_torn_line_in_the_middle_is_read_up_to_and_gone_after_the_next_takeover(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write cut short in the middle of the journal (a full disk, and an older otpmesh
    appended on after it): the next record is glued to the torn one. Before, the whole journal
    was refused ("not a JSON record") and the standby could take nothing over."""
    root = open_state_dir(tmp_path / "state")
    torn = b'{"actor":"s/a","incarn'
    data = _lines(APP, _proc("p1")) + torn + _lines(_actor("s/a", 2), _proc("p2"))
    (root / JOURNAL).write_bytes(data)
    (root / JOURNAL).chmod(0o600)
    records = read_journal(root)
    assert records == [APP, _proc("p1")]
    assert "line 3 of the journal" in caplog.text and "write cut short" in caplog.text
    journal = Journal(root, epoch=bump_epoch(root), after=records)
    journal.append({**APP, "app": 200}, durable=True)
    assert read_journal(root) == [APP, _proc("p1"), {**APP, "app": 200}]
    assert b"incarn" not in (root / JOURNAL).read_bytes()
    journal.close()


BAD_RECORDS = [
    (_actor("s/a", "3"), "the 'actor' record's 'incarnation' is '3', not a positive int"),  # type: ignore[arg-type]
    (_actor("s/a", 0), "'incarnation' is 0, not a positive int"),
    ({"actor": "s/a", "incarnation": 1}, "'proc' is missing, not a string"),
    ({**_proc("p1"), "pid": "7"}, "the 'proc' record's 'pid' is '7', not an int"),
    ({**_proc("p1"), "coords": {"hosts": "0"}}, "'coords' is .*, not a map of names to ints"),
    ({**_proc("p1"), "rank": True}, "'rank' is True, not an int"),
    ({"restart": "s", "at": "yesterday"}, "'at' is 'yesterday', not a finite number"),
    ({"restart": "s", "at": 1.0, "window": "2"}, "'window' is '2', not a positive int"),
    ({"agent_token": 0, "next": "zz"}, "'next' is 'zz', not a hex string"),
    ({"agent_token": "0", "next": "aa"}, "'agent_token' is '0', not an int"),
    ({"group": "g", "epoch": 1.5}, "the 'group' record's 'epoch' is 1.5, not an int"),
    ({"chaos": "controller", "pid": 9, "index": "1"}, "'index' is '1', not an int"),
    ({"chaos": "controller", "step": 3}, "the 'chaos' record's 'pid' is missing, not an int"),
    ({"app": "me", "epoch": 1}, "the 'app' record's 'app' is 'me', not an int"),
]


@pytest.mark.parametrize(("record", "why"), BAD_RECORDS)
def test_a_record_of_the_wrong_shape_is_a_takeover_error_naming_its_line(
    tmp_path: Path, record: dict[str, Any], why: str
) -> None:
    """Before, such a record was read, and the reader that used it raised a KeyError, a
    TypeError or a ValueError from deep in the standby's start (``last_run``, adoption)."""
    root = open_state_dir(tmp_path / "state")
    (root / JOURNAL).write_bytes(_lines(APP, _proc("p0"), record, _proc("p2")))
    (root / JOURNAL).chmod(0o600)
    with pytest.raises(TakeoverError, match=f"line 3 of the journal: .*{why}"):
        last_run(read_journal(root))


def test_bad_json_in_the_middle_is_a_takeover_error_naming_its_line(tmp_path: Path) -> None:
    root = open_state_dir(tmp_path / "state")
    (root / JOURNAL).write_bytes(_lines(APP) + b'{"proc": "p1"}}\n' + _lines(_proc("p2")))
    (root / JOURNAL).chmod(0o600)
    with pytest.raises(TakeoverError, match="line 2 of the journal is not a JSON record"):
        read_journal(root)


def test_a_gap_folds_to_no_run_and_survives_a_compaction() -> None:
    gap = {"gap": 100, "why": "No space left on device"}
    records = [APP, _proc("p1"), gap]
    assert last_run(records).app is None and fold(records).records() == [gap]
    assert last_run([*records, {**APP, "app": 200}]).app == {**APP, "app": 200}
    assert json.loads(json.dumps(gap)) == gap


def test_an_epoch_that_cannot_be_written_is_a_takeover_error_that_says_what_to_do(
    tmp_path: Path,
) -> None:
    """Before, a start on a full file system failed with a raw OSError from epoch.new."""
    with small_fs(tmp_path / "fs", "256k") as fs:
        root = open_state_dir(fs / "state")
        fill(fs)
        with pytest.raises(TakeoverError, match=r"cannot write the fencing epoch.*make room"):
            bump_epoch(root)
