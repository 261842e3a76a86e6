"""``--takeover DIR``: the GRPO job run by two controllers, so that it outlives the death of one.

How to do the same in your own job (docs/guides/takeover.md): start the same program twice with
one state directory, both as standbys; whichever takes the free lease first runs the job, the
other waits for its lease, which the kernel frees when the first one dies. ``run_both`` is that
wrapper (a shell would do as well: ``prog --standby & prog --standby; wait``):

    python -m examples.grpo --takeover "$(mktemp -d)" --chaos

The driver keeps nothing it cannot get back: where the run got to and the curve so far are the
learner's (``resume``), and each iteration's randomness is a function of (seed, iteration), so
the controller that takes over goes on at the learner's next update with the same numbers.
The learner's ranks are taken over in their process group: the epoch they formed goes on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import otpmesh

from .actors import CHECKPOINT

#: Seconds the workers keep their actors without a controller: the standby waits on the lease
#: beside the active one, so it takes over in well under a second.
GRACE = 30.0


def takeover(args: argparse.Namespace) -> otpmesh.Takeover | None:
    """This controller's takeover (None without ``--takeover``); both copies are standbys."""
    if not args.takeover:
        return None
    if args.local:
        raise SystemExit("--takeover keeps worker processes alive for a standby: not with --local")
    return otpmesh.Takeover(dir=args.takeover, grace=GRACE, standby=args.standby)


async def resume(app: otpmesh.App, learner_path: str) -> tuple[int, list[dict[str, float]]]:
    """The iteration to start at and the curve up to it, both read from the learner: (0, [])
    on a fresh start; after a takeover, the updates the learner holds and their stats."""
    learner = app.actor(learner_path)
    first: int = await learner.updates()
    curve = [await learner.stats(iteration) for iteration in range(first)]
    if first:
        sup, _, child = learner_path.rpartition("/")
        incarnation = {c.id: c.incarnation for c in app.which_children(sup)}[child]
        print(
            f"took over at iteration {first} (controller pid {os.getpid()}): {learner_path} "
            f"holds {first} updates, incarnation {incarnation}",
            flush=True,
        )
    return first, curve


def run_both(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Start this program twice as standbys on ``args.takeover``, wait for both, and return
    0 when the job was done: one copy finished (0) and the other ended in order (0: its
    standby found nothing to take over) or was SIGKILLed by the chaos plan."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECKPOINT).unlink(missing_ok=True)  # a fresh run: neither copy may remove it later
    command = [sys.executable, "-m", "examples.grpo", *(sys.argv[1:] if argv is None else argv)]
    copies = [subprocess.Popen([*command, "--standby"]) for _ in range(2)]
    codes = [copy.wait() for copy in copies]
    print(f"controllers: {', '.join(f'pid {c.pid} exit {c.returncode}' for c in copies)}")
    done = 0 in codes and all(code in (0, -signal.SIGKILL) for code in codes)
    return 0 if done else 1
