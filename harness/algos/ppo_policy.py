"""PPO's policy, the module collectors act with: the actor, and where it shares a body with the
critic (images, memory) the value head too (:mod:`harness.algos.ppo` trains it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, cast

import torch
from tensordict import TensorDict
from torch import nn
from torch.distributions import Categorical, Normal

from harness.algos.base import Policy
from harness.algos.memory import STATE, RecurrentActorCritic
from harness.algos.nets import PixelEncoder, layer_init, network
from harness.core.specs import EnvSpec


class PPOPolicy(Policy):
    """The actor: categorical logits, or a Gaussian mean with a learned,
    state-independent log standard deviation for continuous actions. On
    images it also holds the critic's value head on its CNN, and acting
    records each frame's ``value``. With ``memory`` (lstm, gru) the network is ``memory``, a
    :class:`~harness.algos.memory.RecurrentActorCritic` with both heads, and acting takes each
    env's ``state`` and returns the next one with the ``value``."""

    value_head: Optional[nn.Linear]
    memory: Optional[RecurrentActorCritic]

    def __init__(
        self, spec: EnvSpec, hidden_sizes: list[int], memory: str = "none", memory_size: int = 128
    ):
        super().__init__()
        self.discrete, self.memory = spec.discrete, None
        if memory != "none":
            outputs = spec.num_actions
            self.memory = RecurrentActorCritic(spec, hidden_sizes, memory, memory_size, outputs)
            self.value_head = None  # the core's own: values come from the recurrent forward
        else:
            self.net = network(spec, hidden_sizes, spec.num_actions, out_std=0.01)
            features = cast(PixelEncoder, self.net[0]).features if spec.pixels else 0
            self.value_head = layer_init(nn.Linear(features, 1), std=1.0) if spec.pixels else None
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(spec.num_actions))

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        return self.distribution_of(self.net(obs.flatten(1)))

    def distribution_of(self, out: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution the network's output ``out`` describes."""
        out = out.float()  # float32 under algo.amp too: log-probabilities need the precision
        # No argument validation: it costs as much as the network on small MLPs.
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """The value head's values of the CNN's ``features``."""
        return cast(nn.Linear, self.value_head)(features).float().squeeze(-1)

    def log_prob_entropy(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        dist: torch.distributions.Distribution | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(obs) if dist is None else dist
        if self.discrete:
            return dist.log_prob(action), dist.entropy()
        return dist.log_prob(action).sum(-1), dist.entropy().sum(-1)

    def forward(
        self,
        obs: torch.Tensor,
        values: Mapping[str, float] = {},
        deterministic: bool = False,
        state: Optional[torch.Tensor] = None,
    ) -> TensorDict:
        """``state``: with memory, each env's before this step (None: an episode's start)."""
        value: dict[str, torch.Tensor] = {}
        if self.memory is not None:
            memory = self.memory
            state = memory.initial_state(obs.shape[0], obs) if state is None else state
            if (
                self.discrete
                and not deterministic
                and not torch.is_autocast_enabled(obs.device.type)
            ):
                # a collector's step: one function of tensors, the same operations and bits
                action, logprob, value_now, state = memory.sample(obs.flatten(1), state)
                outs = {"action": action, "logprob": logprob, "value": value_now, STATE: state}
                return TensorDict(outs, batch_size=obs.shape[:1])
            out, value_now, state = memory.step(obs.flatten(1), state)
            dist, value = self.distribution_of(out), {"value": value_now, STATE: state}
        elif self.value_head is None:
            dist = self.distribution(obs)
        else:  # the CNN once, for both heads
            features = self.net[0](obs.flatten(1))
            dist = self.distribution_of(self.net[1](features))
            value = {"value": self.value_of(features)}
        if deterministic:
            action = cast(Categorical, dist).probs.argmax(-1) if self.discrete else dist.mean
        else:
            action = dist.sample()
        logprob = dist.log_prob(action) if self.discrete else dist.log_prob(action).sum(-1)
        return TensorDict({"action": action, "logprob": logprob, **value}, batch_size=obs.shape[:1])

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, done: torch.Tensor
    ) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        """With memory, a ``[T, N]`` segment from each env's ``state``: the action distributions
        and the values (:meth:`RecurrentActorCritic.unroll`)."""
        out, value = cast(RecurrentActorCritic, self.memory).unroll(obs.flatten(2), state, done)
        return self.distribution_of(out), value
