"""What bfloat16 autocast does to the policy's share of PPO's gradient in a shared CNN trunk.

    python benchmarks/amp_gradients.py [--returns-std 3.0 0.5 0.05]

``ppo_atari``'s Nature CNN feeds both heads (CleanRL's ``Agent``): the gradient reaching the trunk
is the value loss's plus the policy loss's. For one minibatch of 256 random uint8 frames, from the
same initial weights, in float32 and under ``algo.amp=bf16``: the gradient of the whole loss and of
the value loss alone; their difference is the policy's part. Per trunk parameter it prints that
part's cosine and norm ratio, bf16 against float32, and its size against the value's part
(float32). Returns are drawn with each ``--returns-std`` (the value loss's size). Not a timing.
"""

from __future__ import annotations

import argparse

import torch
from tensordict import TensorDict

from harness.algos.ppo import PPO, PPOConfig
from harness.core.specs import EnvSpec

Grads = dict[str, torch.Tensor]


def minibatch(n: int, returns_std: float) -> TensorDict:
    return TensorDict(
        obs=torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        action=torch.randint(0, 4, (n,)),
        logprob=torch.full((n,), -1.386),  # ln(1/4): the initial policy's
        advantage=torch.randn(n),
        value=torch.zeros(n),
        batch_size=[n],
    ).set("return", torch.randn(n) * returns_std)


def gradients(spec: EnvSpec, state: dict, mb: TensorDict, amp: str, value_only: bool) -> Grads:
    ppo = PPO(PPOConfig(compile=False, amp=amp), spec, 10**6)
    ppo.loss.load_state_dict(state)
    with ppo.autocast():
        out = ppo.losses(mb)
    loss = ppo.cfg.vf_coef * out["value_loss"] if value_only else out["loss"]
    loss.backward()
    return {
        k: p.grad.detach().clone()
        for k, p in ppo.loss.named_parameters()
        if p.grad is not None and "value_head" not in k
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--returns-std", type=float, nargs="+", default=[3.0, 0.5, 0.05])
    args = parser.parse_args()
    spec = EnvSpec((4, 84, 84), discrete=True, action_shape=(), num_actions=4, obs_dtype="uint8")
    cosine = torch.nn.functional.cosine_similarity
    for std in args.returns_std:
        torch.manual_seed(0)
        state = PPO(PPOConfig(compile=False), spec, 10**6).loss.state_dict()
        mb = minibatch(256, std)
        full32, value32 = (gradients(spec, state, mb, "off", v) for v in (False, True))
        full16, value16 = (gradients(spec, state, mb, "bf16", v) for v in (False, True))
        print(f"returns' std {std}:")
        for name, value in value32.items():  # the trunk: where both losses' gradients meet
            policy32 = (full32[name] - value).flatten()
            policy16 = (full16[name] - value16[name]).flatten()
            print(
                f"  {name:30s} policy part, bf16 against float32: cosine "
                f"{cosine(policy32, policy16, dim=0):.3f}, norm ratio "
                f"{policy16.norm() / policy32.norm():.2f}; its size against the value's "
                f"{policy32.norm() / value.norm():.2g}"
            )


if __name__ == "__main__":
    main()
