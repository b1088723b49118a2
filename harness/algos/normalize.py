"""Observation normalisation and reward scaling, as CleanRL's ``ppo_continuous_action.py``
gets them from gymnasium's ``NormalizeObservation``, ``NormalizeReward`` and two clips.

Here they are trainer-side modules, not env wrappers, so that a distributed
run keeps one source of truth:

- :class:`ObsNormalizer` is updated by the trainers only, from the raw
  observations of the frames they learn from, and travels to collectors as
  the ``obs_norm`` model of the weight payload: a collector normalises with
  exactly the statistics of the policy version it acts with. Batches carry
  raw observations, so the trainer normalises them with the statistics of
  its choice (the current version's) and replay buffers stay in env units.
- :class:`RewardScaler` lives on the trainer alone (collectors never need
  it): it keeps each env's discounted return across rounds from the
  rollout's rewards and terminations and divides rewards by that return's
  running standard deviation.

With several trainers both are reduced across them like gradients: every
trainer holds the same statistics of all trainers' frames.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from harness.algos.scan import discounted_prefix_sum

EPSILON = 1e-8  # under the square root, as gymnasium's wrappers


class RunningMeanStd(nn.Module):
    """Mean, population variance and count of a stream, as float64 buffers.

    ``update`` merges a batch exactly (Chan et al.'s parallel formula), so the
    statistics after any split of a stream into batches are its two-pass mean
    and variance. The count starts at 0 (gymnasium starts at 1e-4 with a
    prior of mean 0, variance 1): the prior weighs nothing after the first
    batch, and until then normalising is the identity.
    """

    mean: torch.Tensor  # buffers, registered in __init__
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def reset(self) -> None:
        """Back to no samples."""
        self.mean.zero_()
        self.var.fill_(1.0)
        self.count.zero_()

    @torch.no_grad()
    def update(self, x: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> None:
        """Merge ``x`` (``[..., *shape]``, at least one sample). With ``group``
        (a collective), the batch is the union of every member's ``x``."""
        x = x.to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        # Sums of deviations from the current mean, which every member shares: no
        # cancellation in the squares, and one all-reduce of n, s1, s2 merges them.
        shifted = x - self.mean
        sums = torch.cat(
            [
                x.new_full((1,), x.shape[0]),
                shifted.sum(0).flatten(),
                shifted.square().sum(0).flatten(),
            ]
        )
        if group is not None:
            dist.all_reduce(sums, group=group)
        n, s1, s2 = sums[0], sums[1 : 1 + self.mean.numel()], sums[1 + self.mean.numel() :]
        s1, s2 = s1.view_as(self.mean), s2.view_as(self.mean)
        total = self.count + n
        # The old samples' squared deviations from the old mean sum to var * count and their
        # deviations to 0.
        self.var.copy_((self.var * self.count + s2 - s1.square() / total) / total)
        self.mean.add_(s1 / total)
        self.count.copy_(total)


class ObsNormalizer(RunningMeanStd):
    """``(obs - mean) / sqrt(var + 1e-8)``, clipped to ``[-clip, clip]``: what a
    collector applies before its policy, and a trainer before its networks."""

    def __init__(self, obs_shape: tuple[int, ...], clip: float):
        super().__init__(obs_shape)
        self.clip = clip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        normalized = (obs - self.mean) / (self.var + EPSILON).sqrt()
        return normalized.clamp(-self.clip, self.clip).to(obs.dtype)


class RewardScaler(nn.Module):
    """Rewards divided by the running standard deviation of the discounted
    return, then clipped to ``[-clip, clip]`` (gymnasium's ``NormalizeReward``:
    the mean is not subtracted).

    Each env's discounted return runs across rounds (``returns``; the trainer
    sees every env's rewards in order) and restarts after a termination only,
    as gymnasium's does: a time limit does not end the discounted sum it
    estimates. (Gymnasium restarts it one step early, at the terminating
    reward, a quirk it keeps for compatibility; this sums the episode.)
    It is not checkpointed: a resumed run starts new episodes, so it restarts at 0.
    """

    def __init__(self, gamma: float, clip: float):
        super().__init__()
        self.return_stats = RunningMeanStd()
        self.gamma, self.clip = gamma, clip
        self.returns: Optional[torch.Tensor] = None  # [N]: each env's discounted return so far

    @torch.no_grad()
    def scale(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        group: Optional[dist.ProcessGroup] = None,
    ) -> torch.Tensor:
        """Scaled ``reward`` ``[T, N]``; first, the returns of these T steps
        update the statistics (all trainers' together with ``group``)."""
        if self.returns is None or self.returns.shape != reward.shape[1:]:
            self.returns = torch.zeros(reward.shape[1:], dtype=torch.float64, device=reward.device)
        steps = reward.to(torch.float64, copy=True)
        steps[0] += self.gamma * self.returns  # the return carried on from the last round
        # A step's return carries on into the next step's unless the step ended its episode.
        carries = torch.ones_like(steps)
        carries[1:] = self.gamma * (~terminated[:-1]).to(torch.float64)
        returns = discounted_prefix_sum(steps, carries)
        # Where the last step ended its episode, the next round starts a new one.
        self.returns = returns[-1].masked_fill(terminated[-1], 0.0)
        self.return_stats.update(returns, group)
        scaled = reward / (self.return_stats.var + EPSILON).sqrt()
        return scaled.clamp(-self.clip, self.clip).to(reward.dtype)
