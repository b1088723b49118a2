"""The config composes for every group option and rejects bad values early."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from helpers import CONF, compose_config
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError
from tensordict import TensorDict

from harness.config import Config
from harness.data import dataset

pytestmark = pytest.mark.unit


def test_default_job_is_ppo_cartpole_gloo():
    cfg = compose_config()
    assert (cfg.algo.name, cfg.env.id, cfg.sync.name, cfg.topology.trainers) == (
        "ppo",
        "CartPole-v1",
        "gloo",
        1,
    )
    assert type(cfg.algo).__name__ == "PPOConfig"


def test_tuned_hyper_parameters_apply_to_their_pair_only_and_yield_to_the_command_line():
    tuned = compose_config()  # algo=ppo env=cartpole: conf/tuned/ppo_cartpole.yaml
    assert (tuned.algo.update_epochs, tuned.algo.lr, tuned.collector.frames_per_batch) == (
        10,
        1e-3,
        128,
    )
    assert compose_config("experiment=ppo_cartpole").algo.update_epochs == 10
    generic = compose_config("env=pendulum")  # PPO elsewhere: conf/algo/ppo.yaml's defaults
    assert (generic.algo.update_epochs, generic.algo.lr, generic.collector.frames_per_batch) == (
        4,
        2.5e-4,
        256,
    )
    assert compose_config("algo.update_epochs=3").algo.update_epochs == 3


def tiny_dataset(path: Path, env_id: str) -> str:
    data = TensorDict(
        obs=torch.zeros(2, 1),
        action=torch.zeros(2, 1),
        reward=torch.zeros(2),
        next_obs=torch.zeros(2, 1),
        terminated=torch.zeros(2, dtype=torch.bool),
        truncated=torch.zeros(2, dtype=torch.bool),
        batch_size=[2],
    )
    dataset.save(
        path, data, dataset.Meta(env=env_id, transitions=2, episodes=0, behaviour_return=0.0)
    )
    return str(path)


@pytest.mark.parametrize("group", ["experiment", "debug", "env", "sync", "algo"])
def test_every_config_in_a_group_composes(group, tmp_path):
    names = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert names, f"conf/{group}/ is empty"
    for name in names:
        if name == "nccl" and not torch.cuda.is_available():
            continue  # refused without CUDA, by design (tests/sync/test_sync_schemes.py)
        if "envpool" in name and importlib.util.find_spec("envpool") is None:
            continue  # the envpool extra installs nothing where envpool has no wheel
        overrides = [f"{group}={name}"] + (
            ["env=pendulum"] if group == "algo" and name in ("sac", "td3") else []
        )
        raw = OmegaConf.load(CONF / group / f"{name}.yaml")
        if name in ("iql", "cql", "bc") or raw.get(
            "dataset"
        ):  # offline: compose with a dataset for its env
            ids = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5"}
            env = next((e for e in ids if e in name), "pendulum")
            env_id = ids.get(env, "Pendulum-v1")
            overrides += [f"env={env}", f"dataset={tiny_dataset(tmp_path / name, env_id)}"]
        cfg = compose_config(*overrides)
        assert isinstance(cfg, Config)


def test_offline_algorithms_need_a_dataset_and_online_ones_refuse_it(tmp_path):
    with pytest.raises(ValueError, match="algo=cql learns from a dataset: add dataset=<path>"):
        compose_config("algo=cql")
    with pytest.raises(ValueError, match="dataset= is for offline algorithms"):
        compose_config(
            "algo=sac", "env=pendulum", f"dataset={tiny_dataset(tmp_path / 'ds', 'Pendulum-v1')}"
        )


def test_offline_algorithms_refuse_several_trainers_and_online_ones_take_them_in_both_modes(
    tmp_path,
):
    data = tiny_dataset(tmp_path / "ds", "Pendulum-v1")
    with pytest.raises(
        ValueError,
        match=r"topology.trainers=2: algo=iql learns on one trainer.*Use topology.trainers=1",
    ):
        compose_config("algo=iql", "env=pendulum", f"dataset={data}", "topology.trainers=2")
    for mode in ("sync", "async"):
        assert (
            compose_config(
                "experiment=sac_pendulum", "topology.trainers=2", f"collector.mode={mode}"
            ).topology.trainers
            == 2
        )
        assert (
            compose_config(
                "experiment=dqn_cartpole", "topology.trainers=2", f"collector.mode={mode}"
            ).topology.trainers
            == 2
        )


def test_an_offpolicy_batch_that_several_trainers_cannot_split_is_refused_naming_a_multiple():
    with pytest.raises(
        ValueError,
        match=r"algo.batch_size=255 cannot be split over topology.trainers=2.*algo.batch_size=254",
    ):
        compose_config("algo=sac", "env=pendulum", "topology.trainers=2", "algo.batch_size=255")


@pytest.mark.parametrize(
    "overrides, vtrace",
    [
        ((), False),
        (("collector.mode=async",), True),
        (("collector.pipeline=true",), True),
        (
            ("collector.mode=async", "algo.vtrace=false"),
            False,
        ),  # asked for: GAE on lagged frames, the ablation
        (("algo.vtrace=true",), True),
    ],
)
def test_ppo_learns_with_vtrace_exactly_where_frames_are_older_than_the_weights_unless_told(
    overrides, vtrace
):
    assert compose_config(*overrides).algo.vtrace is vtrace


def test_overrides_reach_typed_fields():
    cfg = compose_config(
        "seed=3",
        "algo.lr=1e-3",
        "collector.num_envs=2",
        "collector.frames_per_batch=32",
        "sync=none",
    )
    assert (cfg.seed, cfg.algo.lr, cfg.collector.num_envs, cfg.sync.name) == (3, 1e-3, 2, "none")


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.lr=-1", "algo.lr=-1 is out of range: algo=ppo needs it > 0"),
        (
            "algo=sac env=pendulum algo.gamma=2",
            "algo.gamma=2 is out of range: algo=sac needs it in (0, 1]",
        ),
        (
            "algo=td3 env=pendulum algo.tau=5",
            "algo.tau=5 is out of range: algo=td3 needs it in (0, 1]",
        ),
        ("algo=dqn algo.gamma=1.5", "algo.gamma=1.5 is out of range"),
        (
            "algo=sac env=pendulum algo.policy_frequency=0",
            "algo.policy_frequency=0 is out of range: algo=sac needs it >= 1",
        ),
        ("algo=cql env=pendulum algo.gradient_steps=0", "algo.gradient_steps=0 is out of range"),
        ("algo=sac env=cartpole", "algo=sac needs continuous actions; use algo=dqn or algo=ppo"),
        ("algo=dqn env=pendulum", "algo=dqn needs discrete actions"),
        ("sync.poll_interval_s=-1", "sync.poll_interval_s must be >= 0"),
        ("dist_timeout_s=-1", "dist_timeout_s must be > 0"),
        (
            "+collector.total_frame=10",
            "collector.total_frame (did you mean collector.total_frames?)",
        ),
        ("collector.frames_per_batch=30", "not a multiple of collector.num_envs=4"),
        ("sync.name=carrier_pigeon", "choose one of"),
        ("env.id=NoSuchEnv-v0", "not a registered gymnasium env"),
        ("algo.gamma=0", "algo.gamma=0 is out of range: algo=ppo needs it in (0, 1]"),
        ("trainer.device=tpu", "trainer.device='tpu': choose auto, cpu or cuda"),
        ("collector.threads=0", "collector.threads='0': choose auto or a number of threads >= 1"),
        (
            "algo.normalize_reward=true collector.mode=async",
            "algo.normalize_reward=true with collector.mode=async",
        ),
        ("algo.obs_clip=0", "algo.obs_clip=0 is out of range: algo=ppo needs it > 0"),
    ],
)
def test_bad_values_fail_with_the_value_and_the_fix(override, message):
    with pytest.raises((ValueError, ValidationError, ConfigCompositionException)) as info:
        compose_config(*override.split())
    assert message in str(info.value)


def test_wrong_type_is_refused_while_composing():
    with pytest.raises(ConfigCompositionException) as info:
        compose_config("algo.lr=fast")
    assert "algo.lr" in str(info.value.__cause__ or info.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigCompositionException):
        compose_config("algo.learning_rate=1e-3")


def test_resolved_config_round_trips_through_yaml(tmp_path):
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        raw = compose("config", overrides=["seed=7"])
    OmegaConf.save(raw, tmp_path / "config.yaml", resolve=True)
    assert OmegaConf.load(tmp_path / "config.yaml").seed == 7


def test_rounded_wire_weights_are_refused_for_on_policy_ppo_only():
    with pytest.raises(ValueError, match="skews PPO's ratio and clipping"):
        compose_config("sync.wire_dtype=bfloat16")  # the default job: PPO, sync mode, GAE
    assert compose_config("sync.wire_dtype=bfloat16", "algo.vtrace=true").algo.vtrace
    assert compose_config("sync.wire_dtype=bfloat16", "collector.mode=async").algo.vtrace
    assert compose_config("sync.wire_dtype=bfloat16", "algo=dqn").sync.wire_dtype == "bfloat16"
