"""GRPO with otpmesh: 4 rollout actors, a reward actor and a data-parallel learner (2 ranks, one
gloo process group) under the RL pipeline tree.

    python -m examples.grpo [--iters 200] [--seed 0] [--chaos] [--chaos-faults N]
                            [--learners 2] [--out-dir grpo_out] [--local] [--takeover DIR]

The controller drives one GRPO iteration at a time: learner rank 0 hands out a handle to its
weights (an ``RDMABuffer``), every rollout reads them through the tensor channel (the sync:
version = iteration) and samples its batch, the reward actor scores the batches, both learner
ranks update (each on its half of the rows, the gradients all-reduced) and rank 0 checkpoints.
The batches and rewards (a few KiB) travel inline in the calls, through the controller. The
program prints one line per iteration and writes ``curve.json`` and ``reward.png`` to ``--out-dir``.

``--chaos`` draws a seeded fault plan (``chaos.FaultPlan``: at iteration k, crash or SIGKILL this
actor; ``--chaos-faults`` of them, aimed at the learner ranks and the rollouts), prints it, and
throws each fault at the top of its iteration, once the restarts of the one before are done;
with the learner group, it also SIGKILLs learner rank 1 in the middle of one update (see
``update_under_kill``). The plan is in iterations, not seconds, so the same command throws the
same faults at the same points on any machine. A rollout (or the reward actor) that dies inside
its call costs only its own share: its call is sent again to its next incarnation and the other
rollouts' batches are kept (``with_retry(lost=...)``: sampling is idempotent in the iteration).
A learner fault re-forms the learner group under a new epoch, whose ranks come back from the
last checkpoint (the reward actor and the rollouts keep running); one during the update costs
the update alone (``apply_update``: asked again with the same batches), and any other fault
re-runs the iteration, whole. Every step is
a pure function of (seed, iteration, learner checkpoint), so the curve is the same, bit for bit,
with and without chaos.

``--takeover DIR`` runs the job as two controllers (``standby.py``: the same program twice, both
standbys, one state directory); with ``--chaos`` the plan also SIGKILLs the active controller
once, and the other takes the tree over and resumes at the iteration the learner reached: every
actor keeps its state, and the curve is read back from the learner's history.

What chaos does change: the wall time and the number of restarts (one per fault), and some
iterations are run twice (whether a call meets the dying actor or waits for its successor depends
on timing, which is why the re-runs are not part of the plan's promise). What would break
the equality, and is avoided here: sampling from a global RNG (a restarted rollout would draw
other numbers; each draws from a generator seeded from (seed, iteration, rank)), a learner step
that draws random numbers (dropout, shuffled minibatches: their RNG state would have to go into
the checkpoint too), and multi-threaded kernels (every process uses one thread). A fault this
run does not throw, a hang (SIGSTOP), would only cost time: calls time out and are retried.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
import trio

import otpmesh
from otpmesh import LogKind, chaos
from supervisors.rl_pipeline import make_tree

from . import plot, standby
from .actors import CHECKPOINT, Batch, Learner, RewardModel, Rollout
from .task import Config

# The root's restart intensity: a learner fault costs one root restart, and so does a rollout
# mesh that reaches its own (4 restarts per PERIOD); the default plan stays well below both.
INTENSITY, PERIOD = 20, 10.0
LEARNER_0 = "rl/learner/0"  # the learner rank that publishes the weights and checkpoints
CALL_TIMEOUT = 60.0  # seconds; a call made while its actor restarts waits for the new one
ATTEMPTS = 20  # per iteration, before the program gives up
T = TypeVar("T")
LOST = 3  # times one rollout's (or the reward's) lost call is sent again in one iteration


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chaos", action="store_true", help="crash and kill actors as it trains")
    parser.add_argument(
        "--chaos-faults",
        type=int,
        default=None,
        help="faults in the --chaos plan (default: one per 40 iterations, at least 3)",
    )
    parser.add_argument("--out-dir", default="grpo_out", help="checkpoint, curve.json, reward.png")
    parser.add_argument(
        "--learners",
        type=int,
        default=2,
        help="data-parallel learner ranks (2: a gloo group; 1: a single learner)",
    )
    parser.add_argument(
        "--local", action="store_true", help='placement="local": one process (one learner)'
    )
    parser.add_argument(
        "--takeover",
        metavar="DIR",
        help="run two controllers with this state directory; --chaos kills the active one once",
    )
    parser.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)  # standby.py's
    return parser.parse_args(argv)


# coordination: begin
def grpo_tree(cfg: Config) -> otpmesh.Supervisor:
    """The RL pipeline tree (supervisors/rl_pipeline.py) with the GRPO actors in it."""
    return make_tree(
        rollout_gpus=cfg.rollouts,
        learner_ranks=cfg.learners,
        intensity=INTENSITY,
        period=PERIOD,
        learner=Learner,
        reward=RewardModel,
        rollout=Rollout,
        args=(cfg.as_dict(),),
        rollout_heal="peer",  # a restarted rollout takes the weights it missed from a peer
    )


async def grpo_iteration(
    app: otpmesh.App, iteration: int, mid_step: MidStep | None = None
) -> dict[str, float]:
    """One GRPO iteration: weights to the rollouts, sample, score, update (every learner rank
    on its share of the rows; rank 0 holds the weights the rollouts read)."""
    learner = app.actor(LEARNER_0).with_timeout(CALL_TIMEOUT)
    reward = app.actor("rl/reward").with_timeout(CALL_TIMEOUT)
    rollouts = app.mesh("rl/rollouts").with_timeout(CALL_TIMEOUT)
    # recovery: begin
    if (done := await learner.stats(iteration)) is not None:
        return done  # applied and checkpointed, but a fault ate the reply
    # recovery: end
    weights = await learner.weights()  # a handle; each rollout reads the tensor itself
    # A rollout that dies mid-call is asked again once restarted; the others' batches are kept.
    batches = (await rollouts.generate.with_retry(lost=LOST)(iteration, weights)).values()
    rewards = await reward.score.with_retry(lost=LOST)(batches)
    # coordination: end
    if mid_step is not None:
        return await update_under_kill(app, mid_step, iteration, batches, rewards)
    # coordination: begin
    return await apply_update(app, iteration, batches, rewards)


async def apply_update(
    app: otpmesh.App, iteration: int, batches: list[Batch], rewards: list[torch.Tensor]
) -> dict[str, float]:
    """Update `iteration` on every learner rank; return its stats."""
    learners = app.mesh("rl/learner").with_timeout(CALL_TIMEOUT)
    # recovery: begin
    learner = app.actor(LEARNER_0).with_timeout(CALL_TIMEOUT)

    # A learner fault costs its update, not the iteration: the batches and rewards are kept and
    # the update is asked again of the new epoch, which restored the checkpoint taken before it
    # (the same update, bit for bit), unless what was lost was only the reply.
    async def update(attempt: int) -> dict[str, float]:
        if attempt > 1 and (done := await learner.stats(iteration)) is not None:
            return done
        # coordination: begin
        stats: dict[str, float] = (await learners.update(iteration, batches, rewards))[0]
        return stats
        # coordination: end

    return await after_faults(app, f"update {iteration}", update)
    # recovery: end


# coordination: end
# recovery: begin
def met_a_fault(err: otpmesh.OtpmeshError) -> bool:
    """Did this call fail because an actor was crashed, killed or restarted under it?"""
    if isinstance(err, otpmesh.ActorDiedError | otpmesh.CallTimeoutError):
        return True
    # A rollout reading the weights of a learner that has just died (or dropped them).
    return isinstance(err, otpmesh.ActorError) and err.type_name == "RDMAError"


async def after_faults(app: otpmesh.App, what: str, step: Callable[[int], Awaitable[T]]) -> T:
    """``step(attempt)`` until it returns, run again after each fault it meets (it must be
    idempotent), once the restarts that fault caused are done; at most ATTEMPTS times."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await step(attempt)
        except otpmesh.OtpmeshError as err:
            if not met_a_fault(err) or attempt == ATTEMPTS:
                raise
            first_line = str(err).splitlines()[0]
            print(f"  {what} re-run after {type(err).__name__}: {first_line}")
        await app.settled()  # the tree has reacted: the restarts this fault caused are done
    raise AssertionError("unreachable")


async def run_iteration(
    app: otpmesh.App, iteration: int, mid_step: MidStep | None = None
) -> dict[str, float]:
    """Run one iteration to completion, re-running it whole when it met a fault before its
    update (every step is idempotent in `iteration`); return its stats. `mid_step`'s faults
    are thrown during the first attempt's update (``update_under_kill``)."""

    async def attempt(n: int) -> dict[str, float]:
        return await grpo_iteration(app, iteration, mid_step if n == 1 else None)

    return await after_faults(app, f"iteration {iteration}", attempt)


async def sync_weights(app: otpmesh.App, version: int) -> None:
    """Every rollout holds the weights of `version` (the learner's now), read once per version:
    a rollout restarted after this takes them from a peer (``heal="peer"``)."""

    async def sync(attempt: int) -> None:
        weights = await app.actor(LEARNER_0).with_timeout(CALL_TIMEOUT).weights()
        await app.mesh("rl/rollouts").with_timeout(CALL_TIMEOUT).sync(version, weights)

    await after_faults(app, f"sync {version}", sync)


# recovery: end
def restarts(app: otpmesh.App) -> Counter[str]:
    """The exits the tree recovered from, by child path: each is one restart decision (a group
    restart counts once, as OTP counts it against the intensity). A learner rank's exit counts
    for the learner group: it is never restarted alone, and which rank's exit the group's
    supervisor hears of first, when one rank's death breaks the other's all-reduce, is a race."""
    return Counter(
        "rl/learner" if e.child_path.startswith("rl/learner/") else e.child_path
        for e in app.events.of_kind(LogKind.CHILD_EXITED)
    )


def chaos_plan(app: otpmesh.App, args: argparse.Namespace) -> chaos.FaultPlan:
    """With --chaos, a plan crashing and SIGKILLing the learner ranks and the rollouts at the
    top of iterations drawn from the seed (never the first: the curve's start is the fault-free
    reference)."""
    if not args.chaos:
        return chaos.FaultPlan(())
    count = args.chaos_faults if args.chaos_faults is not None else max(3, args.iters // 40)
    kills = 1 if args.takeover else 0  # with a standby: SIGKILL the active controller once
    return chaos.FaultPlan.seeded(
        app,
        seed=args.seed,
        steps=args.iters,
        count=min(count, args.iters - 1 - kills),
        targets=["rl/learner", "rl/learner/*", "rl/rollouts/*"],
        faults={"crash": 1, "kill": 1},
        controller_kills=kills,
    )


@dataclass
class MidStep:
    """Faults to throw in the middle of an update (``update_under_kill``), and those thrown."""

    plan: chaos.FaultPlan
    thrown: list[chaos.Fault] = field(default_factory=list)


def mid_step_plan(plan: chaos.FaultPlan, args: argparse.Namespace) -> MidStep:
    """With --chaos and a learner group, one more fault: SIGKILL learner rank 1 in the middle
    of an update, at an iteration drawn from the seed among those `plan` leaves free."""
    free = [i for i in range(1, args.iters) if not plan.at(i)]
    if not args.chaos or args.learners < 2 or not free:
        return MidStep(chaos.FaultPlan(()))
    step = random.Random(args.seed).choice(free)
    return MidStep(chaos.FaultPlan([chaos.PlannedFault(step, "kill", "rl/learner/1")]))


async def update_under_kill(
    app: otpmesh.App,
    mid_step: MidStep,
    iteration: int,
    batches: list[Batch],
    rewards: list[torch.Tensor],
) -> dict[str, float]:
    """The update with `mid_step`'s faults thrown in the middle of it: rank 0 alone is asked
    for the update, so it enters it and blocks in the gradients' all-reduce, waiting for rank
    1; once ``app.stacks`` shows rank 0 inside ``update``, the faults are thrown (rank 1 is
    SIGKILLed). Rank 0's all-reduce breaks, the group's supervisor kills rank 0 and forms a
    new epoch, whose ranks restore the last checkpoint; then the update is asked again, of
    both. Deterministic: rank 0 cannot finish the update without rank 1, so whatever the
    timing, the kill lands mid-step, and rank 0's call fails (killed, or its all-reduce broke
    first: either way the group restarts once)."""
    rank0 = app.actor(LEARNER_0).with_timeout(CALL_TIMEOUT)

    async def doomed_call() -> None:
        try:
            await rank0.update(iteration, batches, rewards)
        except otpmesh.OtpmeshError as err:
            print(f"  update {iteration} failed mid-step: {str(err).splitlines()[0]}")
            return
        raise RuntimeError(f"{LEARNER_0} finished update {iteration} without its peer")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(doomed_call)
        while (await app.stacks(LEARNER_0)).actors.get(LEARNER_0, "idle") == "idle":
            await trio.sleep(0.01)
        mid_step.thrown += await mid_step.plan.inject(app, iteration)
        print(f"  mid-step: {mid_step.plan} while {LEARNER_0} is in update")
    await app.settled()  # the new epoch is formed
    return await apply_update(app, iteration, batches, rewards)


def report(iteration: int, stats: dict[str, float], restarts: int, started: float) -> None:
    print(
        f"iter {iteration:4d}  reward {stats['reward']:.4f}  loss {stats['loss']:+.4f}"
        f"  kl {stats['kl']:.4f}  restarts {restarts:3d}"
        f"  elapsed {time.monotonic() - started:5.1f} s",
        flush=True,
    )


async def main(args: argparse.Namespace) -> list[dict[str, float]]:
    """Train; print one line per iteration; write curve.json and reward.png; return the curve."""
    started = time.monotonic()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not args.standby:  # (standby.py removes it before it starts both controllers)
        (out / CHECKPOINT).unlink(missing_ok=True)  # a fresh run, not a resumed one
    if args.local:
        args.learners = 1  # a process group needs worker processes
    cfg = Config(seed=args.seed, learners=args.learners, out_dir=str(out))
    # The fork server imports these once, before it forks: a learner rank starts in a fresh
    # process at every epoch, and its first optimizer would otherwise import torch._dynamo
    # (0.85 s here), twice per group restart, since the ranks start one after the other.
    os.environ.setdefault("OTPMESH_PRELOAD", "torch,torch._dynamo,torch.distributed")
    seen: list[int] = []  # restarts so far, after each iteration
    takeover = standby.takeover(args)
    placement = "local" if args.local else "procs"
    # coordination: begin
    async with otpmesh.start(grpo_tree(cfg), placement=placement, takeover=takeover) as app:
        # coordination: end
        print(f"tree up in {time.monotonic() - started:.1f} s", flush=True)
        # Where the run got to lives in the learner, not in this process: 0 on a fresh start,
        # the iteration to resume at when this controller took a running tree over.
        first, curve = await standby.resume(app, LEARNER_0)
        plan, faults = chaos_plan(app, args), []
        mid_step = mid_step_plan(plan, args)
        if args.chaos:
            print(f"chaos plan (seed {args.seed}, step = iteration): {plan}", flush=True)
            print(f"mid-step: {mid_step.plan}", flush=True)
        # coordination: begin
        for iteration in range(first, args.iters):
            await sync_weights(app, iteration)
            # coordination: end
            faults += await plan.inject(app, iteration)  # those planned for this iteration
            during = mid_step if mid_step.plan.at(iteration) else None
            # coordination: begin
            stats = await run_iteration(app, iteration, during)
            # coordination: end
            curve.append(stats)
            seen.append(restarts(app).total())
            report(iteration, stats, seen[-1], started)
        await app.settled()
        faults += mid_step.thrown
        by_child = ", ".join(f"{path} {n}" for path, n in sorted(restarts(app).items()))
        by_child = f" ({by_child})" if by_child else ""
        missed = sum(not fault.hit for fault in faults)
        missed_note = f" ({missed} missed)" if missed else ""
        print(
            f"{len(faults)} faults injected{missed_note}, "
            f"{restarts(app).total()} restarts{by_child}"
        )
        restarted = [first + i for i, (a, b) in enumerate(itertools.pairwise([0, *seen])) if b > a]
        print(f"iterations that saw a restart: {', '.join(map(str, restarted)) or 'none'}")
    (out / "curve.json").write_text(json.dumps(curve))
    rewards = [s["reward"] for s in curve]
    plot.write_line_plot(out / "reward.png", rewards, marks=restarted, title="GRPO reward")
    print(
        f"final reward {curve[-1]['reward']:.4f} in {time.monotonic() - started:.1f} s; "
        f"wrote {out / 'curve.json'}, {out / 'reward.png'}"
    )
    return curve


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.takeover and not args.standby:
        raise SystemExit(standby.run_both(args, argv))
    otpmesh.run(main, args)
