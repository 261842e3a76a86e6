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
