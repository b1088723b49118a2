"""Image observations: uint8 from the env to the trainer's network, a CNN chosen by the image's
shape, and a clear refusal from the algorithms that cannot take images."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import compose_config
from tensordict import TensorDict
from torch import nn

from harness.algos import ALGOS, algorithm_for
from harness.algos.nets import PixelEncoder
from harness.collect.envs import env_spec, make_vec_env
from harness.collect.pixels import ChannelsFirst
from harness.collect.rollout import RolloutCollector, batch_template
from harness.core.packing import schema
from harness.core.specs import EnvSpec

pytestmark = pytest.mark.unit

MINATAR = "harness/MinAtar-Breakout-v1"
ATARI_SIZED = EnvSpec((4, 84, 84), True, (), 4, obs_dtype="uint8")


def convolutions(module: nn.Module) -> list[nn.Conv2d]:
    return [m for m in module.modules() if isinstance(m, nn.Conv2d)]


def test_minatar_observes_uint8_images_channels_first_of_0_and_255():
    spec = env_spec(MINATAR)
    assert (spec.obs_shape, spec.obs_dtype, spec.pixels) == ((4, 10, 10), "uint8", True)
    envs = make_vec_env(MINATAR, 2)
    obs, _ = envs.reset(seed=0)
    envs.close()
    assert obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255} and obs.max() == 255


def test_channels_first_moves_the_channel_axis_and_scales_booleans():
    import gymnasium as gym

    class Boolean(gym.Env):
        observation_space = gym.spaces.Box(0, 1, (2, 3, 5), bool)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.arange(30).reshape(2, 3, 5) % 2 == 0, {}

    obs, _ = ChannelsFirst(Boolean()).reset()
    raw = np.arange(30).reshape(2, 3, 5) % 2 == 0
    assert obs.shape == (5, 2, 3) and obs.dtype == np.uint8
    assert (obs == np.moveaxis(raw, -1, 0) * 255).all()


@pytest.mark.parametrize("name", ["ppo", "dqn", "cql"])  # cql: its discrete form, offline
@pytest.mark.parametrize(
    "spec, kernels",
    [(env_spec(MINATAR), [(3, 3)]), (ATARI_SIZED, [(8, 8), (4, 4), (3, 3)])],
    ids=["10x10: MinAtar's network", "84x84: the Nature CNN"],
)
def test_the_cnn_is_chosen_by_the_image_shape_for_every_algorithm_that_takes_images(
    name, spec, kernels
):
    cls = algorithm_for(name, spec)
    algo = cls(cls.Config(compile=False), spec, 10_000)
    assert [c.kernel_size for c in convolutions(algo.policy)] == kernels
    obs = torch.randint(0, 256, (3, *spec.obs_shape), dtype=torch.uint8)
    assert algo.policy.act(obs)["action"].shape == (3,)  # uint8 in, the network makes it float


@pytest.mark.parametrize("spec", [env_spec(MINATAR), ATARI_SIZED], ids=["MinAtar", "Atari"])
def test_ppo_on_images_shares_the_actors_cnn_with_its_value_head_and_runs_it_once_per_minibatch(
    spec,
):
    """CleanRL's Atari ``Agent``: one CNN, an actor head and a critic head, both losses training the
    CNN."""
    algo = ALGOS["ppo"](ALGOS["ppo"].Config(compile=False), spec, 10_000)
    encoder = algo.policy.net[0]
    assert isinstance(algo.policy.value_head, nn.Linear) and convolutions(
        algo.loss
    ) == convolutions(encoder)
    # The loss trains the policy's weights and nothing else: the value head is the policy's, and
    # collectors get it.
    assert {id(p) for p in algo.loss.parameters()} == {id(p) for p in algo.policy.parameters()}
    assert sum(p.numel() for p in algo.policy.value_head.parameters()) == encoder.features + 1
    calls = []
    encoder.register_forward_hook(lambda *_: calls.append(1))
    n = 6
    mb = TensorDict(
        obs=torch.randint(0, 256, (n, *spec.obs_shape), dtype=torch.uint8),
        action=torch.zeros(n, dtype=torch.int64),
        logprob=torch.zeros(n),
        advantage=torch.randn(n),
        value=torch.zeros(n),
        batch_size=[n],
    )
    mb["return"] = torch.randn(n)
    out = algo.loss(mb)
    assert len(calls) == 1
    out["value_loss"].backward()  # the value loss alone reaches the CNN
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())


def test_ppo_on_images_learns_from_the_values_recorded_while_acting_without_a_second_cnn_pass():
    """Acting records each frame's value (the trainer's critic's, of the same weights), and the
    update takes them: the CNN sees the round's next observations and the minibatches, never the
    whole round at once."""
    cls = ALGOS["ppo"]
    algo = cls(
        cls.Config(compile=False, num_minibatches=2, update_epochs=1), env_spec(MINATAR), 10_000
    )
    steps, envs = 8, 3
    obs = torch.randint(0, 2, (steps, envs, *algo.spec.obs_shape), dtype=torch.uint8) * 255
    with torch.no_grad():  # as a collector acts
        acted = algo.policy.act(obs.flatten(0, 1))
        torch.testing.assert_close(acted["value"], algo.loss.value(obs.flatten(0, 1)))
    rollout = TensorDict(
        obs=obs,
        action=acted["action"].view(steps, envs),
        logprob=acted["logprob"].view(steps, envs),
        value=acted["value"].view(steps, envs),
        reward=torch.randn(steps, envs),
        done=torch.zeros(steps, envs, dtype=torch.bool),
        terminated=torch.zeros(steps, envs, dtype=torch.bool),
        batch_size=[steps, envs],
    )
    batch = TensorDict(rollout=rollout, next_obs=obs[-1], batch_size=[])
    rows = []
    algo.policy.net[0].register_forward_hook(
        lambda module, inputs, output: rows.append(output.shape[0])
    )
    metrics = algo.update([batch], 0)
    assert rows == [
        envs,
        steps * envs // 2,
        steps * envs // 2,
    ]  # the bootstrap values, then two minibatches
    assert torch.isfinite(metrics["train/value_loss"])


def test_the_encoder_scales_bytes_to_the_unit_interval_on_its_own_device():
    encoder = PixelEncoder((1, 10, 10))
    conv = convolutions(encoder)[0]
    seen = []
    conv.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    encoder(torch.full((2, 100), 255, dtype=torch.uint8))
    assert (
        seen[0].dtype == torch.float32 and seen[0].max() == 1.0 and seen[0].shape == (2, 1, 10, 10)
    )


@pytest.mark.parametrize(
    "name", sorted(n for n in ALGOS if not algorithm_for(n, env_spec(MINATAR)).takes_pixels)
)
def test_algorithms_without_a_cnn_refuse_images_naming_those_with_one(name):
    overrides = ["algo.normalize_obs=false"] if name in ("sac", "td3", "iql") else []
    with pytest.raises(
        ValueError,
        match=rf"algo={name} takes state vectors only.*use algo=cql or algo=dqn or algo=ppo",
    ):
        compose_config(
            f"algo={name}",
            "env=minatar_breakout",
            *overrides,
            *(["dataset=/nowhere"] if ALGOS[name].offline else []),
        )


def test_observation_normalisation_is_refused_on_images():
    with pytest.raises(ValueError, match=r"algo\.normalize_obs=true with images"):
        compose_config("env=minatar_breakout", "algo.normalize_obs=true")


def test_images_travel_as_bytes_in_the_batch_and_the_channel_schema():
    """The collector's batch and the trainer's template (what the data channel's handshake compares)
    hold uint8 observations: a quarter of float32's bytes."""
    spec = env_spec(MINATAR)
    cls = algorithm_for("ppo", spec)
    policy = cls.make_policy(cls.Config(), spec)
    envs = make_vec_env(MINATAR, 2)
    batch = RolloutCollector(envs, policy, 32, seed=0).collect(_header())
    envs.close()
    trainer_side = batch_template(policy, spec.obs_shape, 16, 2, obs_dtype=spec.obs_dtype)
    assert batch["rollout", "obs"].dtype == torch.uint8 and batch["next_obs"].dtype == torch.uint8
    assert schema(batch) == schema(trainer_side)
    assert batch["rollout", "obs"][0, 0].nbytes == 400  # 4 x 10 x 10 bytes a frame


def _header():
    from harness.sync import Header

    return Header(0)
