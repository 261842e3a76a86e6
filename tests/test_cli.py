"""The `otpmesh` command line, run as users run it (`python -m otpmesh ...` in a subprocess), and
its parsing and input checks in-process."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from otpmesh._cli import _cli, _cli_events, _specfile, _timeline
from otpmesh._core._errors import UsageError
from tests.conftest import alive, stop_notices

ROOT = Path(__file__).parent.parent
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours and bold


def otpmesh_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otpmesh", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One real run of the RL tree in worker processes, with a chaos monkey crashing rollouts,
    recorded to a JSONL file. Seed 3395 at 0.5/s crashes rollouts/3 at 0.48 s and rollouts/2 at
    0.66 s, then nothing until 13.7 s: a slow machine can delay those two and their restarts by
    3 s and the run is still the same."""
    events = tmp_path_factory.mktemp("run") / "run.jsonl"
    done = otpmesh_cli(
        *("run", "supervisors/rl_pipeline.py", "--duration", "4", "--events", str(events)),
        *("--chaos", "0.5", "--chaos-seed", "3395", "--chaos-faults", "crash"),
        *("--chaos-targets", "rl/rollouts/*"),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, events


def test_run_prints_the_tree_then_events_then_the_tree_when_stdout_is_a_pipe(
    recorded_run: tuple[str, Path],
) -> None:
    out, _ = recorded_run
    lines = out.splitlines()
    assert lines[0] == "otpmesh run supervisors/rl_pipeline.py (procs, chaos 0.5/s): started; " + (
        "Ctrl-C stops it"
    )
    assert lines[1].startswith("rl running: 6/6 actors running, 0 actor restarts")
    assert lines[2].split() == [
        "NAME", "KIND", "STATE", "INC", "RESTARTS", "INTENSITY", "LAST", "EXIT"
    ]  # fmt: skip
    assert lines[3].split() == [
        "rl",
        "supervisor",
        "rest_for_one",
        "running",
        "0",
        "0/3",
        "in",
        "60s",
    ]
    assert lines[4].split() == ["├──", "learner", "worker", "Learner", "running", "#1", "0"]
    assert lines[6].split()[:5] == ["└──", "rollouts", "mesh", "gpus=4", "one_for_one"]
    assert lines[7].split() == ["├──", "0", "worker", "Rollout", "running", "#1", "0"]
    assert "fault_injected            rl/rollouts/3  (crash rl/rollouts/3 (chaos monkey))" in out
    assert (
        "child_exited              rl/rollouts/3 #1  (crashed with ChaosCrash: chaos monkey)" in out
    )
    assert "child_started             rl/rollouts/3 #2" in out
    assert "stopping (--duration 4 s)" in out
    final = lines[lines.index(next(x for x in lines if x.startswith("rl stopped: "))) :]
    assert "2 actor restarts, 2 faults injected" in final[0]
    rank3 = next(x for x in final if x.lstrip().startswith("└── 3 "))
    assert "stopped" in rank3 and rank3.endswith("crashed with ChaosCrash: chaos monkey")


def test_events_renders_a_recorded_run_as_a_timeline(recorded_run: tuple[str, Path]) -> None:
    _, events = recorded_run
    done = otpmesh_cli("events", str(events))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(events.read_text().splitlines())
    assert lines[0] == "    0.000 s  child_started             rl/learner #1"
    assert (
        "child_exited              rl/rollouts/3 #1  (crashed with ChaosCrash: chaos monkey)"
        in (done.stdout)
    )
    assert lines[-1].endswith("supervisor_exited         rl  (stopped (shutdown))")

    only = otpmesh_cli("events", str(events), "--path", "rl/rollouts/3", "--kind", "child_started")
    starts = [line.split()[2:] for line in only.stdout.splitlines()]
    assert {tuple(s[:2]) for s in starts} == {("child_started", "rl/rollouts/3")}
    assert [s[2] for s in starts][:2] == ["#1", "#2"]


def test_run_local_from_a_module_path() -> None:
    done = otpmesh_cli("run", "supervisors.pipeline_stages", "--local", "--duration", "0.2")
    assert done.returncode == 0, done.stderr
    assert "otpmesh run supervisors.pipeline_stages (local): started" in done.stdout
    assert "└── stage3  worker Stage" in done.stdout
    assert "pipeline running: 4/4 actors running" in done.stdout
    assert "pipeline stopped: 0/4 actors running" in done.stdout


def test_run_on_a_terminal_redraws_in_place_and_leaves_the_last_frame() -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout is the pseudo-terminal
        os.chdir(ROOT)
        args = ["run", "supervisors/data_parallel.py", "--local", "--duration", "1"]
        os.execv(sys.executable, [sys.executable, "-m", "otpmesh", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    screen = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        screen += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    raw = screen.decode()
    assert os.waitstatus_to_exitcode(status) == 0, raw
    assert "\x1b[32mrunning" in raw  # states in colour (rich: green)
    text = SGR.sub("", raw)  # the colours off, the text stays
    live, _, after = text.partition("\x1b[?1049l")  # leaving the alternate screen
    assert "\x1b[?1049h" in live and live.count("\x1b[H") >= 2  # redrawn in place
    assert "Ctrl-C stops the tree" in live and "dp running: 4/4 actors running" in live
    final = after.replace("\r\n", "\n").splitlines()
    assert final[0] == "otpmesh run supervisors/data_parallel.py (local)"
    assert final[1].startswith("dp stopped: 0/4 actors running")
    assert final[3].split()[:4] == ["dp", "mesh", "gpus=4", "one_for_all"]
    assert "recent events" in final and final[-1].endswith(
        "supervisor_exited         dp  (stopped (shutdown))"
    )


def test_a_root_that_gives_up_ends_the_run_with_status_1_and_says_why() -> None:
    done = otpmesh_cli(
        *("run", "supervisors/rl_pipeline.py", "--local", "--duration", "30", "--chaos", "20"),
        *("--chaos-faults", "crash", "--chaos-targets", "rl/learner"),
    )
    assert done.returncode == 1
    assert done.stderr.startswith(
        "otpmesh: supervisor rl reached its restart intensity (3 restarts in 60.0 s); last exits: "
        "rl/learner crashed with ChaosCrash: chaos monkey"
    )
    final = done.stdout[done.stdout.index("rl gave up: 0/6 actors running") :].splitlines()
    assert final[2].split()[:3] == ["rl", "supervisor", "rest_for_one"]
    assert final[2].split()[3:5] == ["gave", "up"]
    assert final[2].split()[6:9] == ["4/3", "in", "60s"]  # past its intensity: it gave up
    assert final[3].split()[:5] == ["├──", "learner", "worker", "Learner", "exited"]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_ctrl_c_stops_the_tree_with_one_line_and_leaves_no_worker_behind() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otpmesh", "run", "supervisors/serving_replicas.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while not seen or not seen[-1].startswith("└── 3 "):
            line = proc.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
        workers = _descendants(proc.pid)
        assert len(workers) >= 5  # the fork server and the 4 replicas
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    stop_notices(err)
    assert "replicas stopped: 0/4 actors running" in out
    deadline = time.monotonic() + 30  # a hang guard: they are gone well within a second
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in workers if alive(p)] == []


SLOW_TO_STOP = """\
import time
import trio
import otpmesh


class Busy(otpmesh.Actor):
    @otpmesh.endpoint
    def work(self) -> None:
        time.sleep(60)  # a plain-def endpoint: a stop cannot reach it


async def main() -> None:
    tree = otpmesh.Mesh("busy", Busy, shape={"procs": 2}, shutdown=1.5)  # > 1 s: a notice
    async with otpmesh.start(tree) as app, trio.open_nursery() as nursery:
        nursery.start_soon(app.mesh("busy").work.call)
        await trio.sleep(0.5)
        print("busy", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    otpmesh.run(main)
"""


def test_a_slow_stop_after_ctrl_c_says_what_it_waits_for_then_the_one_line(
    tmp_path: Path,
) -> None:
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "busy\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    # stderr is a pipe: plain lines, no rich; a later line names those still left, if any
    notices = stop_notices(err)
    assert notices[0] == (
        "otpmesh: stopping: waiting for busy/0, busy/1 to stop (one busy in a plain-def "
        "endpoint is killed after its shutdown timeout)"
    )


def test_bench_quick_shows_each_step_on_stderr_and_the_results_as_json() -> None:
    done = otpmesh_cli("bench", "--quick", timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["unicast_us"]["calls"] == 100
    assert result["interleaved_us"]["rounds"] == 1  # 100 calls: one block of each
    assert result["interleaved_us"]["ratio_median_of_rounds"] > 0
    restart = result["restart_ms"]
    assert restart["after_exception_to_next_reply_p50"] > 0
    # back to back, and with a warm spare (the steady state): both, same run
    assert restart["after_sigkill_to_next_reply_p50"] > 0
    assert restart["after_sigkill_warm_spare_to_next_reply_p50"] > 0
    for key in ("pipelined_calls_per_s", "pipelined_gather_calls_per_s"):  # both, same run
        assert result[key]["in_flight"] == 500 and result[key]["rate"] > 0, result[key]
    steps = [line for line in done.stderr.splitlines() if line.startswith("otpmesh bench: [")]
    assert len(steps) == 9 and steps[-1].startswith("otpmesh bench: [9/9] one-for-all")


def test_bad_input_exits_2_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time": 1.0, "kind": "child_started", "path": "rl"}\n{oops\n')
    cases = {
        ("events", str(tmp_path / "missing.jsonl")): "otpmesh events: no such file: ",
        ("events", str(bad)): f"otpmesh events: {bad}:2: not JSON (",
        ("run", "supervisors/missing.py"): "otpmesh run: no such file: supervisors/missing.py",
    }
    for args, message in cases.items():
        done = otpmesh_cli(*args)
        assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
        assert done.stderr.startswith(message)


# ---------------------------------------------------------------------- in-process


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        _cli.main(args)
    out, err = capsys.readouterr()
    code = exit_.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_help_for_every_command_and_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--version")
    assert (code, out) == (0, "otpmesh 0.1.0\n")
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    for command in ("run", "events", "bench"):
        assert f"    {command}  " in out
        code, out_command, _ = _main(capsys, command, "--help")
        assert code == 0 and f"usage: otpmesh {command}" in out_command
        assert "examples:" in out_command
    code, _, err = _main(capsys)
    assert code == 2 and "required: COMMAND" in err


def test_bench_options_belong_to_their_suite(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(capsys, "bench", "--sizes", "4")
    assert (code, err) == (
        2,
        "otpmesh bench: --sizes is an option of the rdma suite: otpmesh bench rdma --sizes\n",
    )
    code, _, err = _main(capsys, "bench", "rdma", "--calls", "4")
    assert code == 2 and "--calls is an option of the core suite" in err


def test_run_checks_its_chaos_options_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    tree = "supervisors/rl_pipeline.py"
    code, _, err = _main(capsys, "run", tree, "--chaos", "1", "--chaos-faults", "crash,boom")
    assert code == 2 and "unknown fault ['boom']; known: crash, stop, kill" in err
    code, _, err = _main(capsys, "run", tree, "--chaos", "1", "--chaos-targets", "rl/nope/*")
    assert code == 2 and "--chaos-targets ['rl/nope/*'] match no actor of rl" in err
    code, _, err = _main(capsys, "run", tree, "--duration", "0")
    assert code == 2 and "argument --duration: must be more than 0, not 0" in err


def test_a_tree_is_found_by_file_module_and_attribute(tmp_path: Path) -> None:
    assert _specfile.load_tree("supervisors/rl_pipeline.py").id == "rl"
    assert _specfile.load_tree("supervisors.data_parallel").id == "dp"
    assert _specfile.load_tree(f"{ROOT}/supervisors/pipeline_stages.py:make_tree").id == "pipeline"
    job = tmp_path / "cli_job_tree.py"
    job.write_text(
        "import otpmesh\n"
        "class A(otpmesh.Actor): ...\n"
        "main = otpmesh.Supervisor('job', children=[otpmesh.Worker('a', A)])\n"
        "not_a_tree = 3\n"
    )
    tree: Any = _specfile.load_tree(f"{job}:main")
    assert tree.children[0].actor.__module__ == "cli_job_tree"  # importable by the workers
    with pytest.raises(UsageError, match=r"has no attribute 'tree': define `tree = Supervisor"):
        _specfile.load_tree(str(job))
    with pytest.raises(UsageError, match=r"not_a_tree is a int, not a tree"):
        _specfile.load_tree(f"{job}:not_a_tree")
    with pytest.raises(UsageError, match=r"no module named 'supervisors.nope'"):
        _specfile.load_tree("supervisors.nope")


def test_recorded_lines_are_checked_field_by_field() -> None:
    good = '{"time": 2.5, "kind": "child_exited", "path": "rl", "child": "a", "incarnation": 1, '
    event = _timeline.parse(good + '"reason": "crashed with X: y"}', "f:1")
    assert _timeline.line(event, 2.0) == (
        "    0.500 s  child_exited              rl/a #1  (crashed with X: y)"
    )
    for text, message in [
        ("[]", "f:1: not an event (a JSON object), got list"),
        ('{"time": "1", "kind": "k", "path": "p"}', "f:1: field 'time' is \"1\"; expected int"),
        ('{"time": 1, "path": "p"}', "f:1: field 'kind' is missing; expected str"),
        ('{"time": 1, "kind": "k", "path": "p", "incarnation": true}', "'incarnation' is true"),
    ]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _timeline.parse(text, "f:1")


def test_following_a_file_waits_for_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "growing.jsonl"
    log.write_text('{"a": 1}\n{"b":')

    def write_the_rest() -> None:
        with log.open("a") as f:
            f.write(" 2}\n")

    finish = threading.Timer(0.3, write_the_rest)
    with log.open() as f:
        lines = _cli_events._lines(f, str(log), follow=True)
        assert next(lines) == '{"a": 1}\n'
        finish.start()
        assert next(lines) == '{"b": 2}\n'  # read in two pieces, given whole
    finish.join()


def test_event_filters_take_a_path_and_everything_below_it() -> None:
    event = _timeline.Event(0.0, "child_started", "rl/rollouts", "2", 1)
    assert _timeline.matches(event, ["rl/rollouts"], [])
    assert _timeline.matches(event, ["rl/rollouts/2/"], ["child_started"])
    assert not _timeline.matches(event, ["rl/roll"], [])
    assert not _timeline.matches(event, [], ["child_exited"])
    with pytest.raises(UsageError, match="unknown event kind 'started'; the kinds are: "):
        _timeline.check_kinds(["child_started", "started"])


def test_cli_md_lists_every_chaos_fault_run_accepts() -> None:
    from otpmesh.chaos import FAULTS

    rows = (ROOT / "docs" / "cli.md").read_text().splitlines()
    row = next(line for line in rows if line.startswith("| `--chaos-faults"))
    listed = re.search(r"any of `([^`]*)`", row)
    assert listed is not None, row
    assert listed[1].split(", ") == list(FAULTS)
