"""SIGTERM (``kill``, Kubernetes, Slurm) stops an ``otpmesh.run`` program in order, as Ctrl-C
does: children stop in reverse start order, each actor's ``on_stop`` runs, every process of the
app is gone, and the program exits with status 143 and one line. A real program, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import TERMINATED, alive, stop_notices

PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    import trio
    import otpmesh
    from otpmesh import Supervisor, Worker

    class Saver(otpmesh.Actor):
        def __init__(self, journal: str) -> None:
            self.journal = journal

        @otpmesh.endpoint
        def pid(self) -> int:
            return os.getpid()

        async def on_stop(self, reason: object) -> None:
            await trio.sleep(0.2)  # saving a checkpoint, say
            with open(self.journal, "a") as f:
                f.write(f"{otpmesh.context().path} {reason}\\n")

    async def main() -> None:
        journal = sys.argv[1]
        tree = Supervisor("job", children=[
            Worker("first", Saver, args=(journal,)), Worker("second", Saver, args=(journal,))
        ])
        async with otpmesh.start(tree) as app:
            pids = [await app.actor(p).pid() for p in ("job/first", "job/second")]
            print("pids", *pids, os.getppid(), flush=True)
            await trio.sleep_forever()

    if __name__ == "__main__":
        otpmesh.run(main)
    """
)


def test_sigterm_stops_the_tree_in_order_runs_on_stop_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    script, journal = tmp_path / "job.py", tmp_path / "journal"
    script.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, str(script), str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    assert line.startswith("pids"), line + proc.stderr.read()
    workers = [int(p) for p in line.split()[1:3]]
    fork_server = int(open(f"/proc/{workers[0]}/stat").read().rsplit(")", 1)[1].split()[1])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    stop_notices(err, TERMINATED)
    # Reverse start order, each with OTP's shutdown reason.
    assert journal.read_text().splitlines() == ["job/second shutdown", "job/first shutdown"]
    deadline = time.monotonic() + 30
    while any(alive(p) for p in [*workers, fork_server]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in [*workers, fork_server] if alive(p)]


# The stop signal lands in the runtime's own code, mid-frame: the connection reader that is
# decoding the reply to a call signals its own process. trio would raise KeyboardInterrupt right
# there (tasks under a system task are not protected), tearing the runtime down before it could
# stop the tree (CI saw it once, in a Slurm job's scancel); the stop must still be orderly.
MID_FRAME = PROGRAM.replace(
    "async def main() -> None:",
    textwrap.dedent(
        """\
        import signal
        from otpmesh._wire import _connection

        ARMED = []

        class Signalling(_connection.FrameDecoder):
            def feed(self, data):
                if ARMED and ARMED.pop():
                    os.kill(os.getpid(), int(sys.argv[2]))
                    sum(range(10_000))  # the handler runs here, in the reader's frame
                    print("signalled", flush=True)
                return super().feed(data)

        _connection.FrameDecoder = Signalling

        async def main() -> None:""",
    ),
).replace(
    "        await trio.sleep_forever()",
    "        ARMED.append(True)\n"
    "        await app.actor('job/first').pid()\n"
    "        await trio.sleep_forever()",
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_that_lands_in_the_runtimes_own_code_still_stops_in_order(
    tmp_path: Path, signum: int
) -> None:
    script, journal = tmp_path / "job.py", tmp_path / "journal"
    script.write_text(MID_FRAME)
    assert MID_FRAME.count("ARMED.append(True)") == 1
    proc = subprocess.Popen(
        [sys.executable, str(script), str(journal), str(int(signum))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    out, err = proc.communicate(timeout=60)
    assert "signalled" in out, out + err  # the reader carried on after the handler ran
    if signum == signal.SIGTERM:
        assert proc.returncode == 143, err
        stop_notices(err, TERMINATED)
    else:
        assert proc.returncode == 130, err
        stop_notices(err)
    assert journal.read_text().splitlines() == ["job/second shutdown", "job/first shutdown"]
