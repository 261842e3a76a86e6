"""GRPO as an SPMD torch.distributed program: the twin of ``python -m examples.grpo``.

    python examples/grpo_spmd.py [--iters 200] [--seed 0] [--out-dir grpo_spmd_out]
    torchrun --nproc-per-node=7 examples/grpo_spmd.py [--iters 200] [--seed 0]

Seven ranks, one per actor of the otpmesh version, so the two move the same data between the same
roles: ranks 0 and 1 are the data-parallel learner (each updates on its half of every batch's rows,
the gradients all-reduced over a group of the two; rank 0 broadcasts the weights), rank 2 is the
reward model, ranks 3-6 the rollouts (rollout rank ``rank - 3``). Fewer ranks would do (a learner
could score the batches itself), but then the comparison would no longer be like for like. Started
without torchrun, the script starts its seven ranks itself (forked, with MASTER_ADDR, MASTER_PORT,
RANK and WORLD_SIZE set as torchrun sets them); gloo on CPU.

The task, the policy, sampling and the update are ``examples/grpo/task.py``, shared with the
otpmesh version: same seed, same curve, bit for bit (``tests/test_grpo.py`` checks it). The
learner rank prints one line per iteration and writes ``curve.json`` to ``--out-dir``.
There is no fault tolerance: a rank that dies ends the job (torchrun's ``--max-restarts`` would
restart all seven from scratch).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from grpo.task import Config, GRPOLearner, flat_size, generate, make_policy, score, setup_torch

# coordination: begin
LEARNERS, REWARD, ROLLOUTS = (0, 1), 2, (3, 4, 5, 6)
LEARNER = LEARNERS[0]  # the rank that broadcasts the weights and reports
WORLD = len(LEARNERS) + 1 + len(ROLLOUTS)
BATCH_KEYS = ("prompts", "answers", "logprobs")
# coordination: end


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="grpo_spmd_out", help="where curve.json goes")
    return parser.parse_args()


# coordination: begin
def empty_batch(cfg: Config) -> dict[str, torch.Tensor]:
    """Receive buffers for one rollout batch: recv needs the shapes and dtypes up front."""
    rows = cfg.prompts_per_rollout * cfg.group_size
    return {
        "prompts": torch.empty(rows, 2, dtype=torch.int64),
        "answers": torch.empty(rows, 2, dtype=torch.int64),
        "logprobs": torch.empty(rows, 2),
    }


def send_batch(batch: dict[str, torch.Tensor], dst: int) -> None:
    for key in BATCH_KEYS:
        dist.send(batch[key], dst=dst)


def recv_batch(cfg: Config, src: int) -> dict[str, torch.Tensor]:
    batch = empty_batch(cfg)
    for key in BATCH_KEYS:
        dist.recv(batch[key], src=src)
    return batch


def learner(
    cfg: Config,
    iters: int,
    rank: int,
    weights_group: dist.ProcessGroup,
    learner_group: dist.ProcessGroup,
) -> None:
    """Broadcast the weights (rank 0), receive the batches and their rewards, update on this
    rank's half (the gradients all-reduced over `learner_group`); rank 0 reports."""
    core = GRPOLearner(cfg, rank=rank, ranks=len(LEARNERS), group=learner_group)
    curve, started = [], time.monotonic()
    for iteration in range(iters):
        if rank == LEARNER:
            dist.broadcast(core.flat_weights(), src=LEARNER, group=weights_group)
        batches = [recv_batch(cfg, src) for src in ROLLOUTS]
        rewards = torch.empty(len(ROLLOUTS), cfg.prompts_per_rollout * cfg.group_size)
        dist.recv(rewards, src=REWARD)
        stats = core.update(batches, list(rewards))
        # coordination: end
        curve.append(stats)
        if rank == LEARNER:
            report(iteration, stats, started)
    if rank != LEARNER:
        return
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out_dir) / "curve.json").write_text(json.dumps(curve))
    print(f"final reward {curve[-1]['reward']:.4f}; wrote {Path(cfg.out_dir) / 'curve.json'}")
    # coordination: begin


def reward(cfg: Config, iters: int) -> None:
    """Receive every rollout's batch, score them all, send the rewards to the learner."""
    for _ in range(iters):
        batches = [recv_batch(cfg, src) for src in ROLLOUTS]
        scores = torch.stack([score(batch) for batch in batches])
        for dst in LEARNERS:
            dist.send(scores, dst=dst)


def rollout(cfg: Config, iters: int, rank: int, weights_group: dist.ProcessGroup) -> None:
    """Receive the weights, sample this rank's batch, send it to the reward model and the
    learners."""
    policy = make_policy(cfg)
    flat = torch.empty(flat_size(policy))
    for iteration in range(iters):
        dist.broadcast(flat, src=LEARNER, group=weights_group)
        torch.nn.utils.vector_to_parameters(flat, policy.parameters())
        batch = generate(policy, cfg, iteration, rank - ROLLOUTS[0])
        for dst in (REWARD, *LEARNERS):
            send_batch(batch, dst=dst)


def run_rank(rank: int, args: argparse.Namespace) -> None:
    """What every rank runs: join the group, then play the role its rank number says."""
    setup_torch()
    cfg = Config(seed=args.seed, learners=len(LEARNERS), out_dir=args.out_dir)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)  # env://, as torchrun sets it
    weights_group = dist.new_group([LEARNER, *ROLLOUTS])  # every rank must create every group
    learner_group = dist.new_group(list(LEARNERS))
    if rank in LEARNERS:
        learner(cfg, args.iters, rank, weights_group, learner_group)
    elif rank == REWARD:
        reward(cfg, args.iters)
    else:
        rollout(cfg, args.iters, rank, weights_group)
    dist.destroy_process_group()


# coordination: end
# launch: begin
def spawned_rank(rank: int, args: argparse.Namespace) -> None:
    os.environ["RANK"] = str(rank)
    run_rank(rank, args)


def launch(args: argparse.Namespace) -> None:
    """Under torchrun, be the rank it says; otherwise start all WORLD ranks, as torchrun would."""
    if "RANK" in os.environ:
        if int(os.environ["WORLD_SIZE"]) != WORLD:
            raise SystemExit(f"run with --nproc-per-node={WORLD}, one rank per role")
        run_rank(int(os.environ["RANK"]), args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD))
    torch.multiprocessing.start_processes(
        spawned_rank, args=(args,), nprocs=WORLD, start_method="fork"
    )


# launch: end


def report(iteration: int, stats: dict[str, float], started: float) -> None:
    print(
        f"iter {iteration:4d}  reward {stats['reward']:.4f}  loss {stats['loss']:+.4f}"
        f"  kl {stats['kl']:.4f}  elapsed {time.monotonic() - started:5.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    launch(parse_args())
