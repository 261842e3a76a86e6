"""GRPO with otpmesh: 4 rollout actors, a reward actor and a learner under the RL pipeline tree.

    python -m examples.grpo [--iters 200] [--seed 0] [--chaos] [--chaos-faults N]
                            [--out-dir grpo_out] [--local]

The controller drives one GRPO iteration at a time: the learner hands out a handle to its weights
(an ``RDMABuffer``), every rollout reads them through the tensor channel and samples its batch,
the reward actor scores the batches, the learner updates and checkpoints. The batches and rewards
(a few KiB) travel inline in the calls, through the controller. The program prints one line per
iteration and writes ``curve.json`` and ``reward.png`` to ``--out-dir``.

``--chaos`` draws a seeded fault plan (``chaos.FaultPlan``: at iteration k, crash or SIGKILL this
actor; ``--chaos-faults`` of them, aimed at the learner and the rollouts), prints it, and throws
each fault at the top of its iteration, once the restarts of the one before are done. The plan is
in iterations, not seconds, so the same command throws the same faults at the same points on any
machine. An iteration that meets a fault is run again, whole; the learner comes back from its
last checkpoint (REST_FOR_ONE restarts the reward actor and the rollouts with it). Every step is
a pure function of (seed, iteration, learner checkpoint), so the curve is the same, bit for bit,
with and without chaos.

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
import time
from collections import Counter
from pathlib import Path

import otpmesh
from otpmesh import LogKind, chaos
from supervisors.rl_pipeline import make_tree

from . import plot
from .actors import CHECKPOINT, Learner, RewardModel, Rollout
from .task import Config

# The root's restart intensity: a learner fault costs one root restart, and so does a rollout
# mesh that reaches its own (4 restarts per PERIOD); the default plan stays well below both.
INTENSITY, PERIOD = 20, 10.0
CALL_TIMEOUT = 60.0  # seconds; a call made while its actor restarts waits for the new one
ATTEMPTS = 20  # per iteration, before the program gives up


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
    parser.add_argument("--local", action="store_true", help='placement="local": one process')
    return parser.parse_args(argv)


# coordination: begin
def grpo_tree(cfg: Config) -> otpmesh.Supervisor:
    """The RL pipeline tree (supervisors/rl_pipeline.py) with the GRPO actors in it."""
    return make_tree(
        rollout_gpus=cfg.rollouts,
        intensity=INTENSITY,
        period=PERIOD,
        learner=Learner,
        reward=RewardModel,
        rollout=Rollout,
        args=(cfg.as_dict(),),
    )


async def grpo_iteration(app: otpmesh.App, iteration: int) -> dict[str, float]:
    """One GRPO iteration: weights to the rollouts, sample, score, update."""
    learner = app.actor("rl/learner").with_timeout(CALL_TIMEOUT)
    reward = app.actor("rl/reward").with_timeout(CALL_TIMEOUT)
    rollouts = app.mesh("rl/rollouts").with_timeout(CALL_TIMEOUT)
    # recovery: begin
    if (done := await learner.stats(iteration)) is not None:
        return done  # applied and checkpointed, but a fault ate the reply
    # recovery: end
    weights = await learner.weights()  # a handle; each rollout reads the tensor itself
    batches = (await rollouts.generate(iteration, weights)).values()
    rewards = await reward.score(batches)
    return await learner.update(iteration, batches, rewards)


# coordination: end
# recovery: begin
def met_a_fault(err: otpmesh.OtpmeshError) -> bool:
    """Did this call fail because an actor was crashed, killed or restarted under it?"""
    if isinstance(err, otpmesh.ActorDiedError | otpmesh.CallTimeoutError):
        return True
    # A rollout reading the weights of a learner that has just died (or dropped them).
    return isinstance(err, otpmesh.ActorError) and err.type_name == "RDMAError"


async def run_iteration(app: otpmesh.App, iteration: int) -> dict[str, float]:
    """Run one iteration to completion, re-running it whole when it met a fault (every step is
    idempotent in `iteration`); return its stats."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await grpo_iteration(app, iteration)
        except otpmesh.OtpmeshError as err:
            if not met_a_fault(err) or attempt == ATTEMPTS:
                raise
            first_line = str(err).splitlines()[0]
            print(f"  iteration {iteration} re-run after {type(err).__name__}: {first_line}")
        await app.settled()  # the tree has reacted: the restarts this fault caused are done
    raise AssertionError("unreachable")


# recovery: end
def restarts(app: otpmesh.App) -> Counter[str]:
    """The exits the tree recovered from, by child path: each is one restart decision (a group
    restart counts once, as OTP counts it against the intensity)."""
    return Counter(e.child_path for e in app.events.of_kind(LogKind.CHILD_EXITED))


def chaos_plan(app: otpmesh.App, args: argparse.Namespace) -> chaos.FaultPlan:
    """With --chaos, a plan crashing and SIGKILLing the learner and the rollouts at iterations
    drawn from the seed (never the first: the curve's start is the fault-free reference)."""
    if not args.chaos:
        return chaos.FaultPlan(())
    count = args.chaos_faults if args.chaos_faults is not None else max(3, args.iters // 40)
    return chaos.FaultPlan.seeded(
        app,
        seed=args.seed,
        steps=args.iters,
        count=min(count, args.iters - 1),
        targets=["rl/learner", "rl/rollouts/*"],
        faults={"crash": 1, "kill": 1},
    )


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
    (out / CHECKPOINT).unlink(missing_ok=True)  # a fresh run, not a resumed one
    cfg = Config(seed=args.seed, out_dir=str(out))
    curve: list[dict[str, float]] = []
    seen: list[int] = []  # restarts so far, after each iteration
    # coordination: begin
    async with otpmesh.start(grpo_tree(cfg), placement="local" if args.local else "procs") as app:
        # coordination: end
        print(f"tree up in {time.monotonic() - started:.1f} s", flush=True)
        plan, faults = chaos_plan(app, args), []
        if args.chaos:
            print(f"chaos plan (seed {args.seed}, step = iteration): {plan}", flush=True)
        # coordination: begin
        for iteration in range(args.iters):
            # coordination: end
            faults += await plan.inject(app, iteration)  # those planned for this iteration
            # coordination: begin
            stats = await run_iteration(app, iteration)
            # coordination: end
            curve.append(stats)
            seen.append(restarts(app).total())
            report(iteration, stats, seen[-1], started)
        await app.settled()
        by_child = ", ".join(f"{path} {n}" for path, n in sorted(restarts(app).items()))
        by_child = f" ({by_child})" if by_child else ""
        missed = sum(not fault.hit for fault in faults)
        missed_note = f" ({missed} missed)" if missed else ""
        print(
            f"{len(faults)} faults injected{missed_note}, "
            f"{restarts(app).total()} restarts{by_child}"
        )
        restarted = [i for i, (a, b) in enumerate(itertools.pairwise([0, *seen])) if b > a]
        print(f"iterations that saw a restart: {', '.join(map(str, restarted)) or 'none'}")
    (out / "curve.json").write_text(json.dumps(curve))
    plot.write_line_plot(out / "reward.png", [s["reward"] for s in curve], marks=restarted)
    print(
        f"final reward {curve[-1]['reward']:.4f} in {time.monotonic() - started:.1f} s; "
        f"wrote {out / 'curve.json'}, {out / 'reward.png'}"
    )
    return curve


def cli(argv: list[str] | None = None) -> None:
    otpmesh.run(main, parse_args(argv))
