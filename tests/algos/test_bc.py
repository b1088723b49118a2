"""Behaviour cloning: its loss, its action box, and a real offline run that clones a swing-up
controller on Pendulum."""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import run_harness
from tensordict import TensorDict

from harness.algos.bc import BC, BCConfig
from harness.collect.envs import env_spec
from harness.core.specs import EnvSpec
from harness.data import dataset

PENDULUM = env_spec("Pendulum-v1")


def actor_by_hand(bc: BC, obs: torch.Tensor) -> torch.Tensor:
    """The actor's action from its weights, written out: two ReLU layers, tanh, into the box."""
    first, second, out = (m for m in bc.policy.net if isinstance(m, torch.nn.Linear))
    hidden = torch.relu(
        torch.relu(obs @ first.weight.T + first.bias) @ second.weight.T + second.bias
    )
    low, high = torch.tensor(bc.spec.action_low), torch.tensor(bc.spec.action_high)
    return low + (torch.tanh(hidden @ out.weight.T + out.bias) + 1) / 2 * (high - low)


def fixed_batch(n: int = 256) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(n, 3, generator=g)
    return TensorDict(
        obs=obs,
        action=(2 * torch.sin(obs[:, :1] + obs[:, 1:2])).clamp(-2, 2),  # a function to clone
        reward=torch.randn(n, generator=g),
        next_obs=torch.randn(n, 3, generator=g),
        terminated=torch.zeros(n, dtype=torch.bool),
        truncated=torch.zeros(n, dtype=torch.bool),
        batch_size=[n],
    )


@pytest.mark.unit
def test_bc_loss_is_the_mean_squared_error_to_the_datas_actions_and_steps_reduce_it():
    torch.manual_seed(0)
    bc = BC(BCConfig(compile=False, normalize_obs=False), PENDULUM, 0)
    batch = fixed_batch()

    def mse() -> float:
        with torch.no_grad():
            return float(((actor_by_hand(bc, batch["obs"]) - batch["action"]) ** 2).mean())

    start = mse()
    with torch.no_grad():
        assert float(bc.loss(batch["obs"], batch["action"])) == pytest.approx(start, rel=1e-5)
    logged = [float(bc.learn(batch)["train/actor_loss"]) for _ in range(50)]
    assert logged[0] == pytest.approx(start, rel=1e-5)  # the loss before the first step
    assert mse() < 0.5 * start, (start, mse())


@pytest.mark.unit
def test_bc_actions_stay_in_the_action_box_even_when_the_data_lies_outside_it():
    """Pendulum's box (checked by gymnasium's own space), and an asymmetric one whose data asks
    for actions beyond its upper corner: the actor saturates at the bound, never past it."""
    torch.manual_seed(0)
    bc = BC(BCConfig(compile=False, normalize_obs=False), PENDULUM, 0)
    obs = torch.randn(1000, 3) * 100  # saturates the tanh
    box = gym.make("Pendulum-v1").action_space
    with torch.no_grad():
        actions = bc.policy(obs, deterministic=True)["action"]
    assert all(box.contains(a.numpy()) for a in actions)

    lopsided = EnvSpec((3,), False, (2,), 2, action_low=(0.0, -1.0), action_high=(3.0, 0.5))
    bc = BC(BCConfig(compile=False, normalize_obs=False, lr=1e-2), lopsided, 0)
    batch = fixed_batch()
    batch["action"] = torch.tensor([[5.0, 2.0]]).expand(256, 2)  # beyond high on both
    for _ in range(200):
        bc.learn(batch)
    with torch.no_grad():
        actions = bc.policy(obs, deterministic=True)["action"]
    high, low = torch.tensor([3.0, 0.5]), torch.tensor([0.0, -1.0])
    assert bool(((actions >= low) & (actions <= high)).all())
    assert bool((actions.mean(0) > high - 0.05).all()), actions.mean(0)  # pushed to the bound


def swing_up(obs: np.ndarray) -> np.ndarray:
    """A hand-written Pendulum controller, independent of the harness: pump energy towards the
    upright's (15, in units of the env's dynamics) far from the top, a PD hold near it, blended
    smoothly. About -150 a episode; random actions score about -1,200."""
    cos, sin, speed = obs[..., 0], obs[..., 1], obs[..., 2]
    pump = 0.5 * (15 - (0.5 * speed**2 + 15 * cos)) * speed
    hold = -10 * np.arctan2(sin, cos) - 2 * speed
    near_top = 1 / (1 + np.exp(-20 * (cos - 0.85)))
    return 2 * np.tanh((near_top * hold + (1 - near_top) * pump) / 2)


def episodes(act, n: int, seed: int) -> tuple[TensorDict, float]:
    """``n`` Pendulum episodes with ``act``: the transitions (in the harness's dataset fields) and
    the mean return."""
    env = gym.make("Pendulum-v1")
    rows: dict[str, list] = {k: [] for k in dataset.FIELDS}  # every field a dataset holds
    returns = []
    for episode in range(n):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = act(obs).astype(np.float32).reshape(1)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            step = dict(
                obs=obs,
                action=action,
                reward=reward,
                next_obs=next_obs,
                terminated=terminated,
                truncated=truncated,
            )
            for key, value in step.items():
                rows[key].append(value)
            total, obs, done = total + float(reward), next_obs, terminated or truncated
        returns.append(total)
    types = {"reward": torch.float32, "terminated": torch.bool, "truncated": torch.bool}
    data = TensorDict(
        {k: torch.tensor(np.array(v), dtype=types.get(k)) for k, v in rows.items()},
        batch_size=[len(rows["obs"])],
    )
    return data, float(np.mean(returns))


@pytest.mark.e2e
def test_bc_run_clones_a_swing_up_controller_to_most_of_its_return(workdir):
    """50 episodes (10k transitions) of the controller with Gaussian action noise, saved in the
    harness's dataset format; a real ``harness.train experiment=bc_pendulum`` run of 1,000 gradient
    steps evaluates the clone on 20 episodes. It must close at least 85% of the gap from random
    play to the behaviour's return. It fails if BC does not clone: a wrong loss, actions outside
    or mis-scaled to the box, evaluation without the dataset's normalisation (the clone then acts
    on raw observations it never saw), or too few steps. Here (behaviour -150, random about -1,200,
    so the bound is near -310) runs of seeds 1-5 ended at -180 to -198: 20 evaluation episodes
    vary by about 20 in their mean, well inside that margin."""
    rng = np.random.default_rng(0)
    data, behaviour = episodes(
        lambda o: np.clip(swing_up(o) + 0.5 * rng.standard_normal(), -2, 2), 50, seed=0
    )
    _, random = episodes(lambda o: rng.uniform(-2, 2, size=1), 10, seed=100)
    dataset.save(
        workdir / "swing-up",
        data,
        dataset.Meta(
            env="Pendulum-v1", transitions=data.shape[0], episodes=50, behaviour_return=behaviour
        ),
    )
    run = run_harness(
        [
            "experiment=bc_pendulum",
            "dataset=swing-up",
            "algo.gradient_steps=1000",
            "sync.publish_every_updates=500",
            "logger.log_every_frames=500",
            "eval.episodes=20",
            "run_dir=run",
        ],
        workdir,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with (workdir / "run" / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    assert int(float(last["gradient_steps"])) == 1000
    cloned = float(last["eval/return"])
    assert cloned > behaviour - 0.15 * (behaviour - random), (cloned, behaviour, random)
