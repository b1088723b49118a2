"""Time per gradient update of each algorithm, and replay-buffer throughput.

    python benchmarks/update.py --json bench-update.json

Updates: CleanRL's network sizes, batch 256 (PPO: one minibatch step of 256),
on Pendulum-v1 (SAC, TD3) and CartPole-v1 (PPO, DQN) shapes; medians.
Replay: ``extend`` of 1,000-transition batches and ``sample`` of 256, with
HalfCheetah-sized transitions, at 100k and 1M capacity, in transitions/s;
the reference is a plain ``torch.randint`` + index of the same storage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from tensordict import TensorDict

from harness.algos.dqn import DQN, DQNConfig
from harness.algos.ppo import PPO, PPOConfig
from harness.algos.replay import ReplayBuffer
from harness.algos.sac import SAC, SACConfig
from harness.algos.td3 import TD3, TD3Config
from harness.collect.envs import env_spec


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def offpolicy_batch(obs_dim: int, action: torch.Tensor, n: int = 256) -> TensorDict:
    return TensorDict(obs=torch.randn(n, obs_dim), next_obs=torch.randn(n, obs_dim), reward=torch.randn(n),
                      terminated=torch.zeros(n, dtype=torch.bool), action=action, batch_size=[n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    pendulum, cartpole = env_spec("Pendulum-v1"), env_spec("CartPole-v1")
    for name, algo, data in (
        ("sac", SAC(SACConfig(), pendulum, 10**6), offpolicy_batch(3, torch.rand(256, 1) * 4 - 2)),
        ("td3", TD3(TD3Config(), pendulum, 10**6), offpolicy_batch(3, torch.rand(256, 1) * 4 - 2)),
        ("dqn", DQN(DQNConfig(), cartpole, 10**6), offpolicy_batch(4, torch.randint(0, 2, (256,)))),
    ):
        seconds = timed(lambda: algo.learn(data), args.repeats)
        rows.append({"case": f"update/{name}", "ms": 1000 * seconds})
    ppo = PPO(PPOConfig(), cartpole, 10**6)
    mb = TensorDict(obs=torch.randn(256, 4), action=torch.randint(0, 2, (256,)), logprob=torch.full((256,), -0.69),
                    advantage=torch.randn(256), value=torch.randn(256), batch_size=[256]).set("return", torch.randn(256))

    def ppo_step():
        out = ppo.learner(mb)
        ppo.optimizer.zero_grad()
        out["loss"].backward()
        ppo.optimizer.step()

    rows.append({"case": "update/ppo", "ms": 1000 * timed(ppo_step, args.repeats)})
    transition = TensorDict(obs=torch.zeros(17), next_obs=torch.zeros(17), action=torch.zeros(6), reward=torch.zeros(()),
                            terminated=torch.zeros((), dtype=torch.bool))
    for capacity in (100_000, 1_000_000):
        buffer = ReplayBuffer(capacity, transition)
        chunk = transition.expand(1000).clone()
        extend = timed(lambda: buffer.extend(chunk), args.repeats)
        sample = timed(lambda: buffer.sample(256), args.repeats)
        raw = timed(lambda: buffer.storage["obs"][torch.randint(0, buffer.size, (256,))], args.repeats)
        rows += [{"case": f"replay/extend/{capacity}", "transitions_per_s": 1000 / extend},
                 {"case": f"replay/sample/{capacity}", "transitions_per_s": 256 / sample},
                 {"case": f"reference/index_one_field/{capacity}", "transitions_per_s": 256 / raw}]
    for r in rows:
        print(r, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
