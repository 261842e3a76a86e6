"""The GRPO job, measured: ``python -m otpmesh.bench rl [--small] [--json]``.

Runs the GRPO example (``examples/grpo``: 4 rollouts, a reward actor, a learner; its own task
and its own controller loop, ``train.run_iteration``) with actors that time their phases
(``examples/grpo/timed.py``), in two sizes: the toy (a 6K-parameter policy) and a big variant
(25.2M parameters: 101 MB of weights read by 4 rollouts every iteration). For each it reports,
as medians over the iterations after the first:

- start: from ``otpmesh.start`` to the end of iteration 0 (fork server, workers, constructors,
  the first iteration), and the tree alone;
- one iteration as the controller sees it, and its phases as the actors time them: the weight
  sync (the controller's round trip for the weights' handle, the median of 20, plus the slowest
  rollout's ``read_into``; the learner copies nothing: its parameters are the registered
  buffer), generate (the slowest rollout's sampling), score, update (without the checkpoint)
  and checkpoint, with the sync's share of the iteration;
- a rollout SIGKILLed mid-generate (after its weight read): the extra time of that iteration
  over the median one, and where the restart's time went (kill to process start, imports,
  constructor, the kill to the new incarnation ready and to its first reply);
- the learner SIGKILLed mid-update (its compute done, before its checkpoint): the same, and
  the time from the kill to the lost update asked again of the new learner;
- a rollout SIGKILLed between iterations: its restart with nothing else running.

The kills run ``--kill-rounds`` times (default 1), and each of their figures is the median
over the rounds.

The load average (1 minute) is printed beside every variant, taken before and after it: on a
shared machine the absolute times say as much about the other jobs as about otpmesh; compare
the ratios. It must run from a checkout (the example is not part of the installed package).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

import otpmesh
from otpmesh import chaos

from ._rl_table import table


@dataclass(frozen=True, slots=True)
class Variant:
    """One size of the job: the policy's width, the batch, and how many iterations to time."""

    name: str
    hidden: int
    prompts_per_rollout: int
    lr: float
    iters: int


TOY = Variant("toy", hidden=128, prompts_per_rollout=32, lr=1e-2, iters=20)
# 25.2M parameters; 2 prompts x 8 answers per rollout keep an iteration near a second or two
# on 2 cores (the learner does 4 batches' forward and backward passes, and Adam over 25M);
# the toy's learning rate, 1e-2, makes a policy this wide diverge (NaN) within a few steps.
BIG = Variant("big", hidden=5000, prompts_per_rollout=2, lr=1e-4, iters=6)
SMALL = (replace(TOY, iters=2),)  # the suite's smoke test: every code path, nothing measured
VARIANTS = {"toy": TOY, "big": BIG}
ROLLOUT, LEARNER = "rl/rollouts/1", "rl/learner/0"
MODULES = ("task", "timed", "train")  # of examples/grpo


def _examples() -> tuple[Any, Any, Any]:
    """The GRPO example's modules (task, timed, train), from the checkout (imported by name:
    they are the example's, not this package's)."""
    try:
        task, timed, train = (importlib.import_module(f"examples.grpo.{m}") for m in MODULES)
    except ImportError as err:
        raise SystemExit(
            f"python -m otpmesh.bench rl runs the GRPO example, which lives in the otpmesh "
            f"checkout (examples/grpo), not in the installed package ({err}): run it from the "
            f"checkout's root, `cd otpmesh && python -m otpmesh.bench rl`"
        ) from None
    return task, timed, train


async def measure(variant: Variant, rounds: int = 1) -> dict[str, Any]:
    """Start the job, time `variant.iters` iterations, then `rounds` times: one with a rollout
    SIGKILLed mid-generate, one with the learner SIGKILLed mid-update, and a rollout SIGKILLed
    between iterations; return the figures (the kills' as medians over the rounds)."""
    task, timed, train = _examples()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_rl.") as scratch:
        cfg = task.Config(
            hidden=variant.hidden,
            prompts_per_rollout=variant.prompts_per_rollout,
            lr=variant.lr,
            learners=1,
            out_dir=scratch,
        )
        tree = train.make_tree(
            rollout_gpus=cfg.rollouts,
            learner_ranks=cfg.learners,
            intensity=train.INTENSITY,
            period=train.PERIOD,
            learner=timed.TimedLearner,
            reward=timed.TimedReward,
            rollout=timed.TimedRollout,
            args=(cfg.as_dict(),),
        )
        started = time.perf_counter()
        async with otpmesh.start(tree) as app:
            tree_up = time.perf_counter() - started
            walls, starts = [], []
            for iteration in range(variant.iters):
                starts.append(time.time())
                began = time.perf_counter()
                await train.run_iteration(app, iteration)
                walls.append(time.perf_counter() - began)
                if iteration == 0:
                    start = time.perf_counter() - started
            phases = await _phases(app, starts)
            phases["handle"] = await _handle_round_trip(app)
            phases["weight_sync"] = phases["handle"] + phases["read"]
            iteration_s = statistics.median(walls[1:] or walls)
            result: dict[str, Any] = {
                "variant": variant.name,
                "parameters": task.flat_size(task.make_policy(cfg)),
                "iterations_timed": len(walls) - 1 or 1,
                "start_to_end_of_iteration_0_s": start,
                "tree_up_s": tree_up,
                "iteration_s": iteration_s,
                "phases_s": phases,
                "weight_sync_share": phases["weight_sync"] / iteration_s,
            }
            if rounds:
                result |= await _recoveries(
                    app, train, Path(scratch), variant.iters, rounds, iteration_s, phases
                )
    result["load_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
    return result


async def _recoveries(
    app: otpmesh.App,
    train: Any,
    scratch: Path,
    iteration: int,
    rounds: int,
    typical: float,
    phases: dict[str, float],
) -> dict[str, Any]:
    """`rounds` times, from `iteration` on: a rollout SIGKILLed mid-generate, the learner
    SIGKILLed mid-update, a rollout SIGKILLed between iterations; each figure's median."""
    rollouts, learners, idle = [], [], []
    for n in range(rounds):
        if n:
            # Two rollout restarts a round: rounds in one restart window would add up past the
            # rollout mesh's intensity (one restart per rollout per period), and the tree would
            # restart the whole mesh, which is not what is measured here.
            await trio.sleep(train.PERIOD)
        rollout = await _killed(app, train, iteration, ROLLOUT, scratch / f"r{n}.held", typical)
        # The update's own time varies most under load, and a rollout kill cannot delay it:
        # the extra time before the update says what the kill cost.
        rollout.pop("killed_at")
        before = await _before_update(app, iteration, rollout.pop("began"))
        rollout["extra_before_update_s"] = before - phases["before_update"]
        rollouts.append(rollout)
        learner = await _killed(app, train, iteration + 1, LEARNER, scratch / f"l{n}.held", typical)
        learner.pop("began")
        # From the kill to the lost update asked again of the new learner: its restart, and
        # whatever the controller re-ran before it (the update's own time varies most).
        again = await _before_update(app, iteration + 1, learner.pop("killed_at"))
        learner["kill_to_update_again_s"] = again
        learners.append(learner)
        idle.append(await _killed_idle(app, ROLLOUT))
        iteration += 2
    return {
        "kill_rounds": rounds,
        "rollout_sigkill_mid_generate": _medians(rollouts),
        "learner_sigkill_mid_update": _medians(learners),
        "rollout_sigkill_idle": _medians(idle),
    }


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds that have it."""
    return {k: statistics.median(r[k] for r in rounds if k in r) for k in rounds[0]}


async def _phases(app: otpmesh.App, starts: list[float]) -> dict[str, float]:
    """Per phase, the median over iterations 1.. of the slowest actor's time; and the time
    from an iteration's start to its update's (the weights handle, generate and score)."""
    rollouts = (await app.mesh("rl/rollouts").clocks()).values()
    reward = await app.actor("rl/reward").clocks()
    learner = await app.actor(LEARNER).clocks()
    timed = range(1, len(starts)) if len(starts) > 1 else range(len(starts))

    def median(clocks: list[dict[str, Any]], phase: str) -> float:
        return float(
            statistics.median(max(c["phases"][str(i)][phase] for c in clocks) for i in timed)
        )

    return {
        "read": median(rollouts, "weight_sync"),
        "generate": median(rollouts, "generate"),
        "score": median([reward], "score"),
        "update": median([learner], "update"),
        "checkpoint": median([learner], "checkpoint"),
        "before_update": statistics.median(
            learner["phases"][str(i)]["began"] - starts[i] for i in timed
        ),
    }


async def _handle_round_trip(app: otpmesh.App, calls: int = 20) -> float:
    """The median time the controller takes to get the weights' handle from the learner."""
    learner, times = app.actor(LEARNER), []
    for _ in range(calls):
        began = time.perf_counter()
        await learner.weights()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def _before_update(app: otpmesh.App, iteration: int, started: float) -> float:
    """Seconds from `started` to the start of update `iteration` (the learner's clock)."""
    learner = await app.actor(LEARNER).clocks()
    began: float = learner["phases"][str(iteration)]["began"]
    return began - started


async def _killed_idle(app: otpmesh.App, path: str) -> dict[str, float]:
    """SIGKILL the actor at `path` while the job is idle (between iterations: nothing else
    competes for the cores); where its restart's time went."""
    killed_at = time.time()
    await chaos.kill(app, path)
    await app.settled()
    return _restart(killed_at, (await app.actor(path).clocks())["born"])


def _restart(killed_at: float, born: dict[str, float]) -> dict[str, float]:
    """Where a restart's time went, from an incarnation's birth times (``timed.Clock``)."""
    figures = {
        # Negative: the process was forked before the kill (a spare, or at the tree's start),
        # and the module imported before it too.
        "kill_to_process_start_s": born["process"] - killed_at,
        "kill_to_module_imported_s": born["imported"] - killed_at,
        "kill_to_constructor_s": born["init"] - killed_at,
        "constructor_and_on_start_s": born["ready"] - born["init"],
        "kill_to_ready_s": born["ready"] - killed_at,
    }
    if "first_reply" in born:
        figures["kill_to_first_reply_s"] = born["first_reply"] - killed_at
    return figures


async def _killed(
    app: otpmesh.App, train: Any, iteration: int, path: str, held: Path, typical: float
) -> dict[str, float]:
    """Run `iteration` with the actor at `path` SIGKILLed where its ``arm`` makes it block;
    return the iteration's extra time over `typical` and where the restart's time went."""
    victim = app.actor(path)
    await victim.arm(str(held))
    killed_at = 0.0

    async def kill_when_held() -> None:
        nonlocal killed_at
        while not held.exists():  # the actor writes it once it blocks at the chosen point
            await trio.sleep(0.005)
        killed_at = time.time()
        await chaos.kill(app, path)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_when_held)
        started_at = time.time()
        began = time.perf_counter()
        await train.run_iteration(app, iteration)
        took = time.perf_counter() - began
    born = (await victim.clocks())["born"]
    return {
        "began": started_at,
        "killed_at": killed_at,
        "iteration_s": took,
        "extra_s": took - typical,
        **_restart(killed_at, born),
    }


async def measure_all(variants: tuple[Variant, ...], rounds: int = 1) -> dict[str, Any]:
    # The learner's first Adam step imports torch._dynamo: preloaded by the fork server, as
    # examples/grpo/train.py has it, so a restart does not pay for it.
    os.environ.setdefault("OTPMESH_PRELOAD", "torch,torch._dynamo,torch.distributed")
    results = []
    with contextlib.redirect_stdout(sys.stderr):  # the example's own lines: stdout is ours
        for variant in variants:
            print(f"otpmesh.bench rl: {variant.name} ({variant.iters} iterations)", flush=True)
            results.append(await measure(variant, rounds))
    return {"machine": {"cpus": os.cpu_count()}, "variants": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m otpmesh.bench rl", description=__doc__)
    parser.add_argument(
        "--variant", choices=("toy", "big", "both"), default="both", help="default: both"
    )
    parser.add_argument("--iters", type=int, metavar="N", help="iterations timed per variant")
    parser.add_argument(
        "--small",
        action="store_true",
        help="the toy, 2 iterations and the two kills: a smoke test of the code, not a measurement",
    )
    parser.add_argument(
        "--kill-rounds",
        type=int,
        default=1,
        metavar="N",
        help="rounds of SIGKILLs (rollout mid-generate, learner mid-update, rollout idle), "
        "their figures' medians reported; default 1",
    )
    parser.add_argument("--no-kills", action="store_true", help="no SIGKILLs (--kill-rounds 0)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    chosen: tuple[Variant, ...] = (
        (TOY, BIG) if args.variant == "both" else (VARIANTS[args.variant],)
    )
    variants = SMALL if args.small else chosen
    if args.iters is not None:
        if args.iters < 1:
            parser.error(f"--iters takes at least 1 iteration, not {args.iters}")
        variants = tuple(replace(v, iters=args.iters) for v in variants)
    if args.kill_rounds < 0:
        parser.error(f"--kill-rounds takes 0 or more rounds, not {args.kill_rounds}")
    result = otpmesh.run(measure_all, variants, 0 if args.no_kills else args.kill_rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from rich.console import Console

        Console().print(table(result))


if __name__ == "__main__":
    main()
