"""RL pipeline: rest-for-one over a learner, a reward model and a one-for-one rollout mesh.

    python supervisors/rl_pipeline.py            # each actor in a worker process of its own
    python supervisors/rl_pipeline.py --local    # every actor in this process, same supervision

Use it for on-policy RL (PPO, GRPO, RLHF): rollout workers generate episodes with the learner's
latest weights, a reward model scores them, the learner updates the policy and pushes new weights.

The tree::

    rl                  Supervisor  REST_FOR_ONE, 3 restarts per 60 s
    ├── learner         Worker      owns the policy: weights + optimizer state
    ├── reward          Worker      frozen reward model, scores samples
    └── rollouts        Mesh        gpus=4, ONE_FOR_ONE, 4 restarts per 60 s
        └── 0 1 2 3     one Rollout actor per GPU

REST_FOR_ONE restarts the child that failed and every child *after* it, in start order; the
children before it keep running, state and all. So the list is a dependency order:

- **learner first**: it is the source of truth. When it crashes (a NaN loss, an OOM in the
  backward pass) it comes back from its last checkpoint, so the weights the rollouts hold belong
  to a policy that no longer exists, and the weight-sync group between them (an NCCL broadcast
  group in a real system) died with it: everything after it restarts.
- **reward next**: the rollouts depend on it (they send it their samples), the learner does not.
  A reward-model crash restarts the reward model and the rollouts, dropping half-scored episodes
  cleanly, and never rolls the policy back: the learner keeps its optimizer state.
- **rollouts last**: rollout workers are independent samplers, so the mesh restarts a crashed
  worker on its own GPU and leaves the other three generating (ONE_FOR_ONE inside the mesh). Its
  own intensity absorbs a flaky worker; only a mesh that gives up reaches the root, and being
  last, the root then restarts just that mesh.

**A data-parallel learner** (``make_tree(learner_ranks=2)``, what ``examples/grpo`` runs): the
learner becomes a process-group mesh, ONE_FOR_ALL, whose ranks all-reduce their gradients::

    ├── learner         Mesh        gpus=2, ONE_FOR_ALL, process_group="gloo"
    │   └── 0 1         one learner rank per GPU, one torch.distributed group per epoch

A rank's failure restarts both ranks inside the mesh (a new epoch of the group; they restore
from the checkpoint in ``on_start``) and does not reach the root while the mesh's intensity
holds: the reward model and the rollouts keep running. That is right when the rollouts fetch
the weights afresh at every iteration (as GRPO's do); a system that pushes weights over a
group shared with the rollouts would make the mesh ESCALATE instead, so that REST_FOR_ONE
restarts the rollouts with it.

The price of this order: a learner restart also reloads the frozen reward model. If that reload
is expensive, nest instead: ``Supervisor("rl", strategy=ONE_FOR_ONE, children=[reward,
Supervisor("train", strategy=REST_FOR_ONE, children=[learner, rollouts])])``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Iterable
from typing import Any, Literal

import otpmesh
from otpmesh import ONE_FOR_ALL, ONE_FOR_ONE, REST_FOR_ONE, Heal, Mesh, Supervisor, Worker


class Learner(otpmesh.Actor):
    """The policy's owner. Its state (here a version counter) is what a restart loses."""

    def __init__(self) -> None:
        self.version = 0  # a real learner loads its last checkpoint here

    @otpmesh.endpoint
    def update(self, rewards: list[float]) -> int:
        loss = -sum(rewards) / len(rewards)
        if math.isnan(loss):
            # Let it crash: the supervisor brings back a clean learner, no half-updated state.
            raise FloatingPointError("loss is NaN")
        self.version += 1
        return self.version

    @otpmesh.endpoint
    def policy_version(self) -> int:
        return self.version


class RewardModel(otpmesh.Actor):
    """A frozen scorer: no state to lose, but expensive to load in a real system."""

    def __init__(self, context: int = 256) -> None:
        self.context = context

    @otpmesh.endpoint
    def score(self, samples: list[str]) -> list[float]:
        for sample in samples:
            if len(sample) > self.context:
                raise ValueError(f"sample of {len(sample)} tokens exceeds context {self.context}")
        return [(len(sample) % 7) / 7 for sample in samples]


class Rollout(otpmesh.Actor):
    """One sampler per GPU: generates with the policy version it was last sent."""

    def __init__(self, max_tokens: int = 512) -> None:
        self.max_tokens = max_tokens
        self.policy = 0

    @otpmesh.endpoint
    def set_weights(self, version: int) -> None:
        self.policy = version

    @otpmesh.endpoint
    def generate(self, prompt: str, tokens: int = 16) -> str:
        if tokens > self.max_tokens:
            raise RuntimeError(f"CUDA out of memory generating {tokens} tokens (simulated)")
        return f"{prompt} -> rank {otpmesh.context().rank} with policy v{self.policy}"

    @otpmesh.endpoint
    def policy_version(self) -> int:
        return self.policy


def make_tree(
    *,
    rollout_gpus: int = 4,
    learner_ranks: int | None = None,
    intensity: int = 3,
    period: float = 60.0,
    learner: type[otpmesh.Actor] | str = Learner,
    reward: type[otpmesh.Actor] | str = RewardModel,
    rollout: type[otpmesh.Actor] | str = Rollout,
    args: tuple[Any, ...] = (),
    rollout_heal: Heal | str | None = None,
) -> Supervisor:
    """The RL tree with `rollout_gpus` rollout workers; `intensity`/`period` are the root's.

    `learner`, `reward` and `rollout` are the actor classes (or ``"module:Class"`` paths) to run
    in that shape; every one of them is constructed with `args` (``examples/grpo`` passes its
    own classes and one config).

    With `learner_ranks` set, the learner is a ``Mesh`` of that many ranks, ONE_FOR_ALL (a
    rank cannot be replaced alone); with more than one, the mesh is a data-parallel gloo
    ``torch.distributed`` group (``process_group="gloo"``), re-formed under a new epoch at
    every restart. `rollout_heal` is the rollout mesh's ``heal`` (``"peer"``: a restarted
    rollout takes its weights from a live one)."""
    learner_child: Worker | Mesh = Worker("learner", learner, args=args)
    if learner_ranks is not None:
        learner_child = Mesh(
            "learner",
            learner,
            args=args,
            shape={"gpus": learner_ranks},
            strategy=ONE_FOR_ALL,
            intensity=intensity,
            period=period,
            process_group="gloo" if learner_ranks > 1 else None,
        )
    return Supervisor(
        "rl",
        strategy=REST_FOR_ONE,
        intensity=intensity,
        period=period,
        children=[
            learner_child,
            Worker("reward", reward, args=args),
            Mesh(
                "rollouts",
                rollout,
                args=args,
                shape={"gpus": rollout_gpus},
                strategy=ONE_FOR_ONE,
                intensity=rollout_gpus,
                period=period,
                heal=rollout_heal,
            ),
        ],
    )


tree = make_tree()


# ---- the demo ----------------------------------------------------------------------------------


async def train_step(app: otpmesh.App, step: int) -> int:
    """One on-policy step: generate on every rollout GPU, score, update, push the new weights."""
    rollouts = app.mesh("rl/rollouts")
    samples = await rollouts.generate(f"prompt {step}")  # every rollout worker: a ValueMesh
    rewards = await app.actor("rl/reward").score(samples.values())
    version: int = await app.actor("rl/learner").update(rewards)
    await rollouts.set_weights(version)
    return version


async def fault(app: otpmesh.App, call: Awaitable[Any]) -> list[otpmesh.LogEntry]:
    """Make a call that crashes its actor; return the supervision events it caused."""
    since = len(app.events)
    try:
        await call
    except otpmesh.ActorError as err:
        print(f"  the caller gets ActorError: {err.type_name}: {err.message}")
    await app.settled()  # the exit is handled and the restarts it caused are done
    return list(app.events)[since:]


def print_events(entries: Iterable[otpmesh.LogEntry]) -> None:
    """One line per supervision step: time since the first, kind, path, #incarnation, reason."""
    entries = list(entries)
    t0 = entries[0].time if entries else 0.0
    for e in entries:
        incarnation = "" if e.incarnation is None else f"#{e.incarnation}"
        reason = "" if e.reason is None else str(e.reason)
        ms = (e.time - t0) * 1000
        print(f"  {ms:7.1f} ms  {e.kind:<26}{e.child_path:<18}{incarnation:<4}{reason}".rstrip())


async def main(placement: Literal["procs", "local"] = "procs") -> None:
    async with otpmesh.start(tree, placement=placement) as app:
        learner, reward, rollouts = (
            app.actor("rl/learner"),
            app.actor("rl/reward"),
            app.mesh("rl/rollouts"),
        )
        print("== start: children in order, the mesh's actors inside it")
        print_events(app.events)
        for step in (1, 2):
            print(f"step {step}: learner at policy v{await train_step(app, step)}")

        print("== rollout 2 runs out of memory: the mesh restarts only rollout 2")
        print_events(await fault(app, rollouts[2].generate("long", tokens=4096)))
        print(f"  rollout policies: {(await rollouts.policy_version()).values()}")
        await rollouts.set_weights(await learner.policy_version())  # bring the new one up to date

        print("== the reward model fails: reward and rollouts restart, the learner keeps its state")
        print_events(await fault(app, reward.score(["x" * 1000])))
        print(f"  learner policy: v{await learner.policy_version()} (kept)")
        print(f"  rollout policies: {(await rollouts.policy_version()).values()} (restarted)")

        print("== the learner's loss goes NaN: the learner and everything after it restart")
        print_events(await fault(app, learner.update([math.nan])))
        print(f"  learner policy: v{await learner.policy_version()} (back to its checkpoint)")
        print(f"step 3: learner at policy v{await train_step(app, 3)}")
        stopping = len(app.events)

    print("== stop: children stop in reverse start order")
    print_events(list(app.events)[stopping:])


if __name__ == "__main__":
    otpmesh.run(main, "local" if "--local" in sys.argv[1:] else "procs")
