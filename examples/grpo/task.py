"""The toy task, the policy and GRPO's math: shared, line for line, by both versions.

The task: given two digits ``a`` and ``b``, emit the two digits of ``a + b`` (``7 + 5`` -> ``1 2``,
``3 + 4`` -> ``0 7``). The reward is the fraction of digits right, in [0, 1]; a random policy
scores about 0.1.

The policy is a small MLP that emits the answer one digit at a time (autoregressively: it sees the
prompt, the position and the digit it emitted before). GRPO (Shao et al., 2024, DeepSeekMath):
sample a *group* of answers per prompt, take each answer's reward minus its group's mean, divided
by the group's standard deviation, as its advantage (no value network), and maximize PPO's clipped
surrogate minus a KL penalty to the frozen initial policy.

Everything here is deterministic: sampling draws from a ``torch.Generator`` seeded from
(seed, iteration, rollout rank), and a learner step draws no random numbers at all. So a step
re-executed after a crash gives the same bits, and the SPMD twin gives the same curve.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

DIGITS = 10
ANSWER_LEN = 2
BOS = DIGITS  # the "previous digit" before the first one
FEATURES = 2 * DIGITS + ANSWER_LEN + DIGITS + 1  # one-hot a, b, position, previous digit


@dataclass(frozen=True, slots=True)
class Config:
    """One run's settings: the hyperparameters, and where to write (checkpoint, curve, plot).

    Travels to actors as a plain dict (``as_dict`` there, ``Config(**d)`` back)."""

    seed: int = 0
    rollouts: int = 4
    learners: int = 2  # data-parallel learner ranks
    prompts_per_rollout: int = 32
    group_size: int = 8
    hidden: int = 128
    lr: float = 1e-2
    clip: float = 0.2
    kl_coef: float = 0.05
    max_grad_norm: float = 1.0
    out_dir: str = "grpo_out"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def setup_torch() -> None:
    """One intra-op thread: bit-identical matmuls in every process, and 7 processes share the
    machine's cores instead of fighting over them."""
    torch.set_num_threads(1)


class Policy(torch.nn.Module):
    """p(next digit | a, b, position, previous digit)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, DIGITS),
        )

    def forward(self, prompts: torch.Tensor, position: int, previous: torch.Tensor) -> torch.Tensor:
        """Logits of the digit at `position`, for each row of `prompts` (N, 2)."""
        n = prompts.shape[0]
        features = torch.cat(
            [
                torch.nn.functional.one_hot(prompts[:, 0], DIGITS),
                torch.nn.functional.one_hot(prompts[:, 1], DIGITS),
                torch.nn.functional.one_hot(torch.full((n,), position), ANSWER_LEN),
                torch.nn.functional.one_hot(previous, DIGITS + 1),
            ],
            dim=1,
        ).float()
        return self.net(features)


def make_policy(cfg: Config) -> Policy:
    """The initial policy: the same weights in every process for the same seed."""
    torch.manual_seed(cfg.seed)
    return Policy(cfg.hidden)


def flat_size(policy: Policy) -> int:
    return sum(p.numel() for p in policy.parameters())


def token_logprobs(policy: Policy, prompts: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """log p(answers[:, t] | ...) for every row and position: (N, ANSWER_LEN)."""
    previous = torch.full((prompts.shape[0],), BOS)
    columns = []
    for t in range(ANSWER_LEN):
        logp = torch.log_softmax(policy(prompts, t, previous), dim=-1)
        columns.append(logp.gather(1, answers[:, t : t + 1]).squeeze(1))
        previous = answers[:, t]
    return torch.stack(columns, dim=1)


def sampling_generator(cfg: Config, iteration: int, rank: int) -> torch.Generator:
    """The RNG of rollout `rank` at `iteration`: a pure function of the three, so a rollout
    re-executed after a restart (or on another rank layout) draws the same numbers."""
    return torch.Generator().manual_seed((cfg.seed * 1_000_003 + iteration) * 1_009 + rank)


@torch.no_grad()
def generate(policy: Policy, cfg: Config, iteration: int, rank: int) -> dict[str, torch.Tensor]:
    """One rollout's batch: `prompts_per_rollout` prompts, `group_size` answers each.

    Returns prompts (N, 2), answers (N, ANSWER_LEN) and their log-probabilities under the
    sampling policy (GRPO's "old" policy), with N = prompts * group_size, groups contiguous.
    """
    g = sampling_generator(cfg, iteration, rank)
    prompts = torch.randint(0, DIGITS, (cfg.prompts_per_rollout, 2), generator=g)
    prompts = prompts.repeat_interleave(cfg.group_size, dim=0)
    previous = torch.full((prompts.shape[0],), BOS)
    answers = []
    for t in range(ANSWER_LEN):
        probs = torch.softmax(policy(prompts, t, previous), dim=-1)
        previous = torch.multinomial(probs, 1, generator=g).squeeze(1)
        answers.append(previous)
    answer = torch.stack(answers, dim=1)
    return {
        "prompts": prompts,
        "answers": answer,
        "logprobs": token_logprobs(policy, prompts, answer),
    }


def score(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reward model: the fraction of the answer's digits that are right, per row."""
    total = batch["prompts"].sum(dim=1)
    target = torch.stack([total // 10, total % 10], dim=1)
    return (batch["answers"] == target).float().mean(dim=1)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO's advantage: reward minus its group's mean, over the group's std (0 if all equal)."""
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / (std + 1e-6)).view(-1)


def grpo_loss(
    policy: Policy,
    reference: Policy,
    batch: dict[str, torch.Tensor],
    rewards: torch.Tensor,
    cfg: Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate with a KL penalty to `reference`; returns (loss, mean KL)."""
    advantages = group_advantages(rewards, cfg.group_size).unsqueeze(1)
    logp = token_logprobs(policy, batch["prompts"], batch["answers"])
    with torch.no_grad():
        ref_logp = token_logprobs(reference, batch["prompts"], batch["answers"])
    ratio = torch.exp(logp - batch["logprobs"])
    clipped = torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    # The k3 estimator of KL(policy || reference), always >= 0 (Schulman, 2020), as GRPO uses.
    log_ratio = ref_logp - logp
    kl = torch.exp(log_ratio) - log_ratio - 1
    return -(surrogate - cfg.kl_coef * kl).mean(), kl.mean()


class GRPOLearner:
    """The policy, its frozen reference and the optimizer; one GRPO update per iteration.

    An update takes one optimizer step per rollout batch, in rank order, so every step after
    the first sees a policy that has moved away from the sampling one: the clip matters.

    Data-parallel over `ranks` learners (``rank`` is this one, `group` their torch.distributed
    group): each takes its contiguous share of every batch's rows (whole prompt groups, so the
    advantages are the same), computes the loss on it, and the gradients are all-reduced and
    averaged before the step, so every rank takes the same step. The loss is a mean over rows
    and the shares are equal, so the average of the shares' gradients is the whole batch's
    gradient, up to float rounding: the curve is not bit-identical to ``ranks=1``'s, but it is
    the same on every rank, on every run and in both versions (a sum of two floats does not
    depend on their order).
    """

    def __init__(
        self, cfg: Config, rank: int = 0, ranks: int = 1, group: Any | None = None
    ) -> None:
        rows = cfg.prompts_per_rollout * cfg.group_size
        if cfg.prompts_per_rollout % ranks:
            raise ValueError(
                f"{cfg.prompts_per_rollout} prompts per batch do not split into {ranks} equal "
                f"shares of whole groups; use a learner count that divides it"
            )
        self.cfg = cfg
        self.share = slice(rank * rows // ranks, (rank + 1) * rows // ranks)
        self.ranks, self.group = ranks, group
        self.policy = make_policy(cfg)
        self.reference = make_policy(cfg).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr)

    def update(
        self, batches: list[dict[str, torch.Tensor]], rewards: list[torch.Tensor]
    ) -> dict[str, float]:
        """Apply one iteration's batches; return its mean reward, loss and KL."""
        losses, kls = [], []
        for batch, reward in zip(batches, rewards, strict=True):
            mine = {key: value[self.share] for key, value in batch.items()}
            loss, kl = grpo_loss(self.policy, self.reference, mine, reward[self.share], self.cfg)
            self.optimizer.zero_grad()
            loss.backward()
            loss_value, kl_value = self._average(loss.detach(), kl.detach())
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            losses.append(loss_value)
            kls.append(kl_value)
        return {
            "reward": torch.cat(rewards).mean().item(),
            "loss": sum(losses) / len(losses),
            "kl": sum(kls) / len(kls),
        }

    def _average(self, loss: torch.Tensor, kl: torch.Tensor) -> tuple[float, float]:
        """Average the gradients, the loss and the KL over the ranks: one all-reduce of one
        flat tensor (what DDP does, in buckets); return the averaged loss and KL."""
        if self.ranks == 1:
            return loss.item(), kl.item()
        import torch.distributed as dist

        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        flat = torch.cat([*(g.reshape(-1) for g in grads), loss.reshape(1), kl.reshape(1)])
        dist.all_reduce(flat, group=self.group)
        flat /= self.ranks  # exact for 2 ranks: a power of two
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        return flat[-2].item(), flat[-1].item()

    def flat_weights(self) -> torch.Tensor:
        """The policy's parameters as one flat tensor (what the rollouts read)."""
        return torch.nn.utils.parameters_to_vector(self.policy.parameters()).detach()

    def state_dict(self) -> dict[str, Any]:
        """Everything an update changes: the policy and the optimizer (the reference is the
        initial policy, rebuilt from the seed; an update draws no random numbers)."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
