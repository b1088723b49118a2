"""Time per gradient update of each algorithm, and replay-buffer throughput.

    python benchmarks/update.py --json bench-update.json

Updates: CleanRL's (offline: CORL's) network sizes, batch 256 (PPO: one
minibatch step of 256), on Pendulum-v1 (SAC, TD3, IQL, CQL) and CartPole-v1
(PPO, DQN, discrete CQL) shapes; medians. CQL is timed with CORL's 10 sampled
actions per kind and with the 4 of the cql_pendulum preset.
Offline sampling: 256 transitions from a memory-mapped 1M-transition dataset
(Hopper-sized) against the same sample from RAM.
Replay: ``extend`` of 1,000-transition batches and ``sample`` of 256, with
HalfCheetah-sized transitions, at 100k and 1M capacity, in transitions/s;
the reference is a plain ``torch.randint`` + index of the same storage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
from tensordict import TensorDict

from harness.algos.cql import CQL, CQLConfig, DiscreteCQL
from harness.algos.dqn import DQN, DQNConfig
from harness.algos.iql import IQL, IQLConfig
from harness.algos.ppo import PPO, PPOConfig
from harness.algos.replay import ReplayBuffer
from harness.algos.sac import SAC, SACConfig
from harness.algos.td3 import TD3, TD3Config
from harness.collect.envs import env_spec
from harness.data import dataset


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
        ("iql", IQL(IQLConfig(), pendulum, 0), offpolicy_batch(3, torch.rand(256, 1) * 4 - 2)),
        ("cql", CQL(CQLConfig(), pendulum, 0), offpolicy_batch(3, torch.rand(256, 1) * 4 - 2)),
        ("cql_4_actions", CQL(CQLConfig(n_actions=4), pendulum, 0), offpolicy_batch(3, torch.rand(256, 1) * 4 - 2)),
        ("cql_discrete", DiscreteCQL(CQLConfig(), cartpole, 0), offpolicy_batch(4, torch.randint(0, 2, (256,)))),
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
    with tempfile.TemporaryDirectory() as tmp:
        n = 1_000_000
        data = TensorDict(obs=torch.randn(n, 11), next_obs=torch.randn(n, 11), action=torch.randn(n, 3), reward=torch.randn(n),
                          terminated=torch.zeros(n, dtype=torch.bool), truncated=torch.zeros(n, dtype=torch.bool), batch_size=[n])
        dataset.save(tmp, data, dataset.Meta(env="Hopper-v5", transitions=n, episodes=0, behaviour_return=0.0))
        mapped, _ = dataset.load(tmp)
        memmap = timed(lambda: mapped[torch.randint(0, n, (256,))], args.repeats)
        ram = timed(lambda: data[torch.randint(0, n, (256,))], args.repeats)
        rows += [{"case": "dataset/sample/memmap/1000000", "transitions_per_s": 256 / memmap},
                 {"case": "reference/dataset/sample/ram/1000000", "transitions_per_s": 256 / ram}]
    for r in rows:
        print(r, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
