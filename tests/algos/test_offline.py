"""Offline RL: datasets the harness writes and loads, IQL and CQL."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import re
import subprocess

import numpy as np
import pytest
import torch
from helpers import ROOT, launch_env, run_harness
from tensordict import TensorDict

from harness.algos import algorithm_for, offline
from harness.algos.cql import CQL, CQLConfig, cql_penalty
from harness.algos.iql import IQL, IQLConfig, expectile_loss
from harness.algos.nets import PixelEncoder
from harness.collect.envs import env_spec
from harness.core import checkpoint
from harness.data import dataset
from harness.roles.loops import publish_due
from harness.rundir.state import Progress, TrainerState

PENDULUM, CARTPOLE = env_spec("Pendulum-v1"), env_spec("CartPole-v1")
MINATAR = "harness/MinAtar-Breakout-v1"


def write_dataset(args: list[str], cwd, nproc: int = 1) -> subprocess.CompletedProcess:
    return run_harness(args, cwd, nproc, module="harness.cli.dataset")


def random_transitions(n: int, obs_dim: int = 3) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        obs=torch.randn(n, obs_dim, generator=g),
        action=torch.rand(n, 1, generator=g) * 4 - 2,
        reward=torch.randn(n, generator=g),
        next_obs=torch.randn(n, obs_dim, generator=g),
        terminated=torch.rand(n, generator=g) < 0.1,
        truncated=torch.rand(n, generator=g) < 0.1,
        batch_size=[n],
    )


@pytest.mark.unit
def test_dataset_round_trip_is_bit_exact(tmp_path):
    data = random_transitions(1000)
    meta = dataset.Meta(
        env="Pendulum-v1",
        transitions=1000,
        episodes=5,
        behaviour_return=-500.0,
        random_return=-1200.0,
        expert_return=-150.0,
    )
    dataset.save(tmp_path / "ds", data, meta)
    loaded, loaded_meta = dataset.load(tmp_path / "ds", "Pendulum-v1")
    assert loaded_meta == meta
    for key in dataset.FIELDS:
        assert loaded[key].dtype == data[key].dtype and torch.equal(loaded[key], data[key]), key
    assert meta.normalized(-150.0) == 100.0 and meta.normalized(-1200.0) == 0.0


@pytest.mark.unit
def test_dataset_for_another_env_is_refused(tmp_path):
    dataset.save(
        tmp_path / "ds",
        random_transitions(10),
        dataset.Meta(env="Pendulum-v1", transitions=10, episodes=0, behaviour_return=0.0),
    )
    with pytest.raises(
        dataset.DatasetError,
        match=re.escape("collected on Pendulum-v1, but this run is env.id=CartPole-v1"),
    ):
        dataset.load(tmp_path / "ds", "CartPole-v1")
    data, _ = dataset.load(tmp_path / "ds")
    with pytest.raises(
        dataset.DatasetError, match=r"observations \(3,\).*env has observations \(4,\)"
    ):
        dataset.check_shapes("ds", data, CARTPOLE.obs_shape, CARTPOLE.action_shape)


@pytest.mark.unit
def test_missing_unfinished_and_damaged_datasets_say_what_to_do(tmp_path):
    with pytest.raises(dataset.DatasetError, match=r"does not exist.*harness dataset"):
        dataset.load(tmp_path / "nowhere")
    storage = dataset.allocate(
        tmp_path / "half", random_transitions(1)[0], 10
    )  # a write that never finished
    assert storage.shape == (10,)
    with pytest.raises(
        dataset.DatasetError, match=re.escape("no meta.json: its write never finished")
    ):
        dataset.load(tmp_path / "half")
    dataset.finish(
        tmp_path / "half",
        dataset.Meta(env="Pendulum-v1", transitions=11, episodes=0, behaviour_return=0.0),
    )
    with pytest.raises(
        dataset.DatasetError, match=re.escape("meta.json says 11 transitions, data/ holds 10")
    ):
        dataset.load(tmp_path / "half")
    (tmp_path / "half" / "meta.json").write_text('{"env": "Pendulum-v1", "transiti')  # cut short
    with pytest.raises(
        dataset.DatasetError, match=r"meta.json is damaged.*write the dataset again"
    ):
        dataset.load(tmp_path / "half")


@pytest.mark.e2e
def test_written_dataset_holds_every_rank_share_and_mixes(workdir):
    """Two real ranks roll out random actions into one storage; then a mix of two datasets."""
    done = write_dataset(
        ["env=cartpole", "out=rand", "frames=2001", "num_envs=2"], workdir, nproc=2
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data, meta = dataset.load(workdir / "rand", "CartPole-v1")
    assert meta.transitions == 2001 == data.shape[0] and [s["rank"] for s in meta.sources] == [0, 1]
    assert (data["obs"].abs().sum(-1) > 0).all()  # no row left unwritten by either rank
    assert (
        10 < meta.behaviour_return < 40 and 10 < meta.random_return < 40
    )  # random CartPole lasts about 22 steps
    # Within an episode, each transition's next observation is the following one's observation
    # (ranks' rows are [time, env] flattened: env e's next step is 2 rows on).
    rank0 = data[:1000]
    follows = ~(rank0["terminated"] | rank0["truncated"])[:-2]
    assert torch.equal(rank0["next_obs"][:-2][follows], rank0["obs"][2:][follows])
    # meta.json's episodes are those that end inside the data (rank 0's share is 1,001 rows, its
    # last batch cut after one), summed per env column: here, by the test's own walk of the rows.
    returns = []
    for share in (data[:1001], data[1001:]):
        for env in range(2):
            total = 0.0
            for row in share[env::2]:
                total += float(row["reward"])
                if row["terminated"] or row["truncated"]:
                    returns.append(total)
                    total = 0.0
    assert meta.episodes == len(returns) and meta.behaviour_return == pytest.approx(
        np.mean(returns)
    )
    assert meta.return_range == [min(returns), max(returns)]

    again = write_dataset(["env=cartpole", "out=rand2", "frames=500", "seed=7"], workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    mixed = write_dataset(["mix=[rand,rand2]", "out=mixed"], workdir)
    assert mixed.returncode == 0, mixed.stderr[-3000:]
    data_mixed, meta_mixed = dataset.load(workdir / "mixed")
    second, _ = dataset.load(workdir / "rand2")
    assert meta_mixed.transitions == 2501 and torch.equal(
        data_mixed["obs"], torch.cat([data["obs"], second["obs"]])
    )
    ranges = [meta.return_range, dataset.load(workdir / "rand2")[1].return_range]
    assert meta_mixed.return_range == [min(r[0] for r in ranges), max(r[1] for r in ranges)]
    refused = write_dataset(["out=rand", "frames=10"], workdir, nproc=2)
    assert refused.returncode != 0 and "already holds a dataset" in refused.stderr


@pytest.mark.e2e
def test_an_image_dataset_keeps_bytes_from_the_writer_to_discrete_cqls_cnn(workdir):
    """MinAtar frames are written as uint8 (a quarter of float32's bytes on disk), sampled as uint8,
    made float only inside the Q-network's CNN; and a real launch of discrete CQL trains on them."""
    frames = 300
    done = write_dataset(["env=minatar_breakout", "out=pixels", f"frames={frames}"], workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = env_spec(MINATAR)
    data, _ = dataset.load(workdir / "pixels", MINATAR)
    assert data["obs"].dtype == data["next_obs"].dtype == torch.uint8 and data["obs"].shape == (
        frames,
        4,
        10,
        10,
    )
    assert (
        workdir / "pixels" / "data" / "obs.memmap"
    ).stat().st_size == frames * 400  # 4 x 10 x 10 bytes a frame
    algo = algorithm_for("cql", spec)(CQLConfig(batch_size=32, compile=False), spec, 0)
    encoder = next(m for m in algo.policy.modules() if isinstance(m, PixelEncoder))
    inputs: list[torch.Tensor] = []
    encoder.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    algo.use_dataset(data)
    assert all(math.isfinite(float(v)) for v in algo.update([], 0).values())
    assert inputs and all(x.dtype == torch.uint8 for x in inputs)

    run = run_harness(
        [
            "algo=cql",
            "env=minatar_breakout",
            "dataset=pixels",
            "algo.gradient_steps=40",
            "run_dir=cql",
        ],
        workdir,
        nproc=2,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with open(workdir / "cql" / "metrics.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    assert int(float(last["gradient_steps"])) == 40 and math.isfinite(float(last["train/td_loss"]))


@pytest.mark.unit
def test_minari_dataset_written_by_minari_loads_as_transitions(tmp_path, monkeypatch):
    minari = pytest.importorskip(
        "minari", reason="the offline extra is not installed: pip install -e '.[offline]'"
    )
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = gym.make("Pendulum-v1")
    episodes = []
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        done = False
        while not done:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            (
                observations.append(obs),
                actions.append(action),
                rewards.append(reward),
                terms.append(terminated),
                truncs.append(truncated),
            )
            done = terminated or truncated
        episodes.append(
            EpisodeBuffer(
                observations=np.array(observations),
                actions=np.array(actions),
                rewards=np.array(rewards),
                terminations=np.array(terms),
                truncations=np.array(truncs),
            )
        )
    minari.create_dataset_from_buffers(
        dataset_id="pendulum/test-v0",
        buffer=episodes,
        env=env,
        eval_env=env.spec,
        algorithm_name="random",
        author="harness tests",
        author_email="tests@harness.invalid",
        code_permalink="https://example.invalid/harness",
        description="two random episodes",
        ref_min_score=-1200.0,
        ref_max_score=-150.0,
    )
    data, meta = dataset.load("minari:pendulum/test-v0", "Pendulum-v1")
    assert data.shape == (400,) and meta.transitions == 400 and meta.episodes == 2
    first = episodes[0]
    assert torch.equal(
        data["obs"][:200], torch.from_numpy(np.array(first.observations[:-1])).float()
    )
    assert torch.equal(
        data["next_obs"][:200], torch.from_numpy(np.array(first.observations[1:])).float()
    )
    assert bool(data["truncated"][199]) and not bool(data["truncated"][198])
    assert meta.behaviour_return == pytest.approx(np.mean([np.sum(e.rewards) for e in episodes]))
    assert (meta.random_return, meta.expert_return) == (-1200.0, -150.0)
    with pytest.raises(
        dataset.DatasetError, match=r"not on this machine.*minari download pendulum/other-v0"
    ):
        dataset.load("minari:pendulum/other-v0")


@pytest.mark.unit
def test_expectile_loss_hand_checked():
    diff = torch.tensor([1.0, -2.0])  # Q above V weighs 0.7, below 0.3
    assert expectile_loss(diff, 0.7).item() == pytest.approx((0.7 * 1 + 0.3 * 4) / 2)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(
        0.5 * (1 + 4) / 2
    )  # 0.5: half the mean squared error


@pytest.mark.unit
def test_iql_critic_loss_is_the_mean_over_both_critics_as_corl():
    """CORL's ``sum(F.mse_loss(q, targets) for q in qs) / len(qs)``, with ``targets = r + (1 - d) *
    gamma * V(s')`` from V before its own step: the harness's sum over the critics doubled their
    learning rate."""
    iql = IQL(IQLConfig(batch_size=32), PENDULUM, 0)
    batch = random_transitions(32)
    next_v = torch.randn(32)
    loss, q = iql.critic_loss(batch, next_v)
    targets = batch["reward"] + (1 - batch["terminated"].float()) * 0.99 * next_v
    corl = sum(torch.nn.functional.mse_loss(q_i, targets) for q_i in q) / 2
    assert loss.item() == pytest.approx(float(corl), rel=1e-6)


@pytest.mark.unit
def test_iql_actor_lr_follows_corls_cosine_and_resumes_with_the_step_count():
    """Step k's actor lr is what torch's ``CosineAnnealingLR(T_max=gradient_steps)`` gives after k -
    1 steps (CORL steps it after each update); it is read from the step count, so a resumed run
    carries on the curve."""
    steps = 10
    iql = IQL(IQLConfig(batch_size=16, gradient_steps=steps, actor_lr=1e-3), PENDULUM, 0)
    iql.use_dataset(random_transitions(64))
    reference = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(reference, steps)
    for _ in range(steps):
        logged = float(iql.update([], 0)["train/actor_lr"])  # a float32 tensor
        assert iql.actor_optimizer.param_groups[0]["lr"] == pytest.approx(
            reference.param_groups[0]["lr"], abs=1e-12
        )
        assert logged == pytest.approx(reference.param_groups[0]["lr"], rel=1e-6, abs=1e-12)
        reference.step()
        schedule.step()
    resumed = IQL(iql.cfg, PENDULUM, 0)
    resumed.gradient_steps = 5  # as a checkpoint restores it
    resumed.use_dataset(random_transitions(64))
    expected = 1e-3 * (1 + math.cos(math.pi * 5 / steps)) / 2
    assert float(resumed.update([], 0)["train/actor_lr"]) == pytest.approx(expected)


@pytest.mark.unit
def test_iql_deterministic_actor_regresses_onto_the_datas_actions():
    """``algo.deterministic_actor`` (CORL's hopper-medium setting): the published policy acts the
    same for evaluation and collection, inside the action box, and its loss is the squared error to
    the data's action."""
    iql = IQL(IQLConfig(batch_size=16, deterministic_actor=True), PENDULUM, 0)
    policy = iql.published_models()["policy"]
    obs = torch.randn(5, 3)
    acted = policy(obs)["action"]
    assert torch.equal(acted, policy(obs, deterministic=True)["action"])
    assert bool((acted.abs() <= 2.0).all())
    data_action = torch.zeros(5, 1)
    assert torch.allclose(policy.regression_loss(obs, data_action), acted.pow(2).sum(-1))
    assert "log_std" not in dict(policy.named_parameters())


@pytest.mark.unit
def test_cql_penalty_hand_checked():
    q = torch.tensor([[1.0, 2.0, 3.0]])
    expected = math.log(math.exp(1) + math.exp(2) + math.exp(3)) - 1.0
    assert cql_penalty(q, torch.zeros_like(q), torch.tensor([1.0])).item() == pytest.approx(
        expected
    )
    # Importance weights: actions drawn with density p count as exp(Q) / p.
    log_p = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    assert cql_penalty(q, log_p, torch.tensor([1.0])).item() == pytest.approx(
        expected + math.log(2)
    )
    # Temperature T: T * logsumexp(Q / T); a low one approaches the hard maximum.
    assert cql_penalty(
        q, torch.zeros_like(q), torch.tensor([1.0]), temperature=0.01
    ).item() == pytest.approx(2.0, abs=1e-3)


@pytest.mark.unit
def test_reward_scale_multiplies_the_rewards_cql_learns_from():
    """The TD target is ``reward_scale * r + gamma * Q'(s', pi(s'))``: from the same start, the
    logged mean target moves by exactly ``(1 - scale) * r``, and the dataset keeps its rewards. CQL
    logs its diagnostics."""
    data = random_transitions(256)
    data["reward"].fill_(-2.0)

    def first_update(scale: float) -> dict[str, float]:
        torch.manual_seed(0)
        cql = CQL(
            CQLConfig(batch_size=256, n_actions=2, compile=False, reward_scale=scale), PENDULUM, 0
        )
        cql.use_dataset(data)
        return {k: float(v) for k, v in cql.update([], 0).items()}

    full, scaled = first_update(1.0), first_update(0.25)
    assert full["train/target_q"] - scaled["train/target_q"] == pytest.approx(-1.5, abs=1e-4)
    assert bool((data["reward"] == -2.0).all())
    assert all(math.isfinite(scaled[f"train/{k}"]) for k in ("q_random", "q_policy", "q1"))
    assert (
        0 < scaled["train/policy_share"] < 1
    )  # the pi(s), pi(s') samples' share of the soft maximum
    with pytest.raises(ValueError, match=re.escape("algo.reward_scale=0 is out of range")):
        CQLConfig(reward_scale=0.0)


@pytest.mark.unit
def test_cql_bc_steps_clone_the_datasets_actions_then_maximise_q():
    """For its first ``bc_steps`` the actor's objective is the data action's log-likelihood: a
    dataset whose action is always 1.5 pulls the policy's mean there (without the penalty, which
    would favour the data's action too, Q on random rewards has no reason to); afterwards, and after
    a resume, the step is CQL's without cloning."""
    data = random_transitions(256)
    data["action"].fill_(1.5)
    torch.manual_seed(0)
    cql = CQL(
        CQLConfig(
            batch_size=64, n_actions=2, compile=False, actor_lr=1e-2, cql_alpha=0.0, bc_steps=150
        ),
        PENDULUM,
        0,
    )
    cql.use_dataset(data)
    obs = data["obs"][:64]

    def likelihood() -> float:
        with torch.no_grad():
            return float(cql.policy.log_prob(obs, data["action"][:64]).mean())

    start = likelihood()
    for _ in range(150):
        cql.update([], 0)
    cloned = likelihood()
    _, _, mean = cql.policy.sample(obs)
    assert cloned > start + 2 and float((mean - 1.5).abs().mean()) < 0.2, (
        start,
        cloned,
        mean.mean(),
    )
    never_cloning = CQL(dataclasses.replace(cql.cfg, bc_steps=0), PENDULUM, 0)
    resumed = CQL(
        cql.cfg, PENDULUM, 0
    )  # from a checkpoint: it counts on from step 150, so it clones no more
    for algo in (never_cloning, resumed):
        algo.load_state_dict(
            copy.deepcopy(cql.state_dict())
        )  # a copy: Adam loads its moments uncopied
        algo.use_dataset(data)
    for algo in (cql, never_cloning, resumed):
        torch.manual_seed(1)
        algo.update([], 0)
    reference = never_cloning.policy.state_dict()
    for algo in (cql, resumed):
        after = algo.policy.state_dict()
        assert all(torch.equal(after[k], reference[k]) for k in after)
    with pytest.raises(ValueError, match=re.escape("algo.bc_steps=-1 is out of range")):
        CQLConfig(bc_steps=-1)


@pytest.mark.unit
def test_offline_checkpoints_without_the_step_count_resume_counting_from_their_updates():
    """Checkpoints saved before the algorithm's state held ``gradient_steps`` resume at the run's
    update count (offline, one update is one gradient step), so ``bc_steps`` does not start
    again."""
    cql = CQL(CQLConfig(batch_size=32, n_actions=2, compile=False, bc_steps=100), PENDULUM, 0)
    state = TrainerState(cql, Progress(updates=42), 0, None, keep_replay=False).state_dict()
    del state["algo"]["gradient_steps"]
    fresh = CQL(CQLConfig(batch_size=32, n_actions=2, compile=False, bc_steps=100), PENDULUM, 0)
    TrainerState(fresh, Progress(), 0, None, keep_replay=False).load_state_dict(state)
    assert fresh.gradient_steps == 42


@pytest.mark.unit
def test_offline_normalize_obs_learns_on_the_datasets_statistics(monkeypatch):
    """With ``algo.normalize_obs`` the statistics are the dataset's two-pass mean and variance
    (computed in chunks, the same again on a second call), and the batches ``learn`` sees are
    normalised with them."""
    data = random_transitions(1000)
    for key in ("obs", "next_obs"):
        data[key] = data[key] * torch.tensor([1.0, 3.0, 0.1]) + torch.tensor([0.0, 5.0, -2.0])
    monkeypatch.setattr(offline, "STATISTICS_CHUNK", 128)
    iql = IQL(IQLConfig(batch_size=32, normalize_obs=True), PENDULUM, 0)
    obs = data["obs"].double()
    for _ in range(2):
        iql.use_dataset(data)
        assert torch.allclose(iql.obs_norm.mean, obs.mean(0)) and torch.allclose(
            iql.obs_norm.var, obs.var(0, unbiased=False)
        )
    seen = []
    monkeypatch.setattr(iql, "learn", lambda batch: seen.append(batch) or {})
    torch.manual_seed(3)
    iql.update([], 0)
    torch.manual_seed(3)
    index = torch.randint(0, 1000, (32,))
    for key in ("obs", "next_obs"):
        expected = (
            (data[key][index].double() - obs.mean(0)) / obs.var(0, unbiased=False).sqrt()
        ).float()
        assert torch.allclose(seen[0][key], expected, atol=1e-5)


@pytest.mark.unit
@pytest.mark.parametrize(
    "algo,spec",
    [
        (IQL(IQLConfig(batch_size=32), PENDULUM, 0), PENDULUM),
        (IQL(IQLConfig(batch_size=32, deterministic_actor=True), PENDULUM, 0), PENDULUM),
        (CQL(CQLConfig(batch_size=32, n_actions=3, compile=False), PENDULUM, 0), PENDULUM),
        (
            algorithm_for("cql", CARTPOLE)(CQLConfig(batch_size=32, compile=False), CARTPOLE, 0),
            CARTPOLE,
        ),
    ],
    ids=["iql", "iql-deterministic", "cql", "cql-discrete"],
)
def test_offline_updates_run_and_change_the_policy(algo, spec):
    n = 64
    data = random_transitions(n, obs_dim=spec.obs_shape[0])
    if spec.discrete:
        data["action"] = torch.randint(0, spec.num_actions, (n,))
    algo.use_dataset(data)
    before = [p.detach().clone() for p in algo.published_models()["policy"].parameters()]
    metrics = [algo.update([], 0) for _ in range(3)]
    assert all(math.isfinite(v) for row in metrics for v in row.values())
    after = list(algo.published_models()["policy"].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.unit
def test_slow_steps_publish_before_the_evaluators_give_up():
    """Publishes come every ``publish_every_updates`` steps, and sooner when that
    many steps outlast half the evaluators' wait (5,000 CQL steps at 0.15 s each
    outlasted their 600 s and the run died at its first publish)."""
    assert publish_due(5000, every=5000, silent_s=10.0, wait_bound_s=600.0)
    assert not publish_due(4000, every=5000, silent_s=299.0, wait_bound_s=600.0)
    assert publish_due(2001, every=5000, silent_s=301.0, wait_bound_s=600.0)


@pytest.mark.e2e
def test_offline_run_needs_a_dataset_and_one_for_its_env(workdir):
    done = write_dataset(["env=pendulum", "out=pend", "frames=200"], workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    missing = run_harness(["algo=iql", "env=pendulum"], workdir)
    assert (
        missing.returncode != 0
        and "algo=iql learns from a dataset: add dataset=<path>" in missing.stderr
    )
    wrong = run_harness(["algo=cql", "env=cartpole", "dataset=pend"], workdir)
    assert (
        wrong.returncode != 0
        and "collected on Pendulum-v1, but this run is env.id=CartPole-v1" in wrong.stderr
    )


@pytest.mark.e2e
def test_normalize_reward_scales_by_the_datasets_episode_return_range(workdir):
    """CORL's normalize_reward: rewards times the episode cut-off over the range of the dataset's
    episode returns (here the test's own sums of the rows of one env); a dataset whose meta.json
    does not record the range is refused with one message, before any rank starts."""
    done = write_dataset(["env=hopper", "out=hop", "frames=1500", "num_envs=1"], workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    data, meta = dataset.load(workdir / "hop")
    ends = (data["terminated"] | data["truncated"]).nonzero().flatten().tolist()
    returns = [
        float(data["reward"][a + 1 : b + 1].double().sum()) for a, b in zip([-1, *ends], ends)
    ]
    if not bool(data["terminated"][-1]):
        returns = returns[:-1]  # the row where the data stops is marked, but ends no episode
    assert meta.return_range == pytest.approx([min(returns), max(returns)])
    common = ["algo=iql", "env=hopper", "dataset=hop", "algo.hidden=32", "eval.episodes=1"]
    run = run_harness(
        [*common, "algo.gradient_steps=20", "algo.normalize_reward=true", "run_dir=run"], workdir
    )
    assert run.returncode == 0, run.stderr[-3000:]
    said = re.search(r"rewards times ([\d.e+-]+)", run.stdout + run.stderr)
    assert said and float(said[1]) == pytest.approx(1000 / (max(returns) - min(returns)), rel=1e-3)

    meta_file = workdir / "hop" / "meta.json"
    older = json.loads(meta_file.read_text())
    del older["return_range"]  # as meta.json was written before the range was recorded
    meta_file.write_text(json.dumps(older))
    refused = subprocess.run(  # as a user launches it: scripts/train.sh, two ranks
        [
            str(ROOT / "scripts" / "train.sh"),
            *common,
            f"dataset={workdir / 'hop'}",
            "algo.normalize_reward=true",
            f"run_dir={workdir / 'run2'}",
        ],
        cwd=workdir,
        env=launch_env({"NPROC": "2"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = (refused.stdout + refused.stderr).strip()
    assert refused.returncode == 2 and said.startswith("error: "), said[-3000:]
    assert said.count("error:") == 1 and "does not record" in said and "Traceback" not in said
    assert not (workdir / "run2").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_discrete_cql_learns_cartpole_from_random_play(workdir):
    """Random play lasts about 22 steps; CQL on 20k random transitions, with two
    collector ranks evaluating published weights, does far better."""
    done = write_dataset(
        ["env=cartpole", "out=rand", "frames=20000", "reference.episodes=20"], workdir
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_harness(
        [
            "algo=cql",
            "env=cartpole",
            "dataset=rand",
            "algo.gradient_steps=3000",
            "algo.cql_alpha=1.0",
            "algo.tau=1.0",
            "algo.target_update_every=100",
            "algo.hidden=64",
            "sync.publish_every_updates=250",
            "logger.log_every_frames=500",
            "eval.episodes=5",
            "run_dir=run",
        ],
        workdir,
        nproc=3,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with (workdir / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["gradient_steps"]) for r in rows] == [500, 1000, 1500, 2000, 2500, 3000]
    final = rows[-1]
    assert (
        int(float(final["eval/version"])) == 12
    )  # the last row holds the final weights' evaluation
    behaviour = json.loads((workdir / "rand" / "meta.json").read_text())["behaviour_return"]
    assert float(final["eval/return"]) > 4 * behaviour, final


@pytest.mark.e2e
def test_offline_run_in_one_process_resumes_counting_gradient_steps(workdir):
    """World size 1 evaluates inline; a longer second run on the same run_dir
    continues from the first one's checkpoint."""
    done = write_dataset(["env=cartpole", "out=rand", "frames=1000"], workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    common = [
        "algo=cql",
        "env=cartpole",
        "dataset=rand",
        "algo.hidden=32",
        "algo.normalize_obs=true",  # the dataset's statistics, evaluated with and saved
        "sync.publish_every_updates=100",
        "logger.log_every_frames=100",
        "eval.episodes=2",
        "run_dir=run",
    ]
    first = run_harness([*common, "algo.gradient_steps=200"], workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_harness([*common, "algo.gradient_steps=400"], workdir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout + second.stderr
    with (workdir / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["gradient_steps"]) for r in rows] == [100, 200, 300, 400]
    assert all(r["eval/return"] for r in rows) and [
        int(float(r["eval/version"])) for r in rows
    ] == [1, 2, 3, 4]
    assert all(r["eval/return_sem"] not in ("", "nan") for r in rows)  # 2 episodes an evaluation
    obs = dataset.load(workdir / "rand", "CartPole-v1")[0]["obs"].double()
    saved = checkpoint.read(checkpoint.checkpoint_dir(workdir / "run") / "step-000000000400")[0][
        "algo"
    ]["obs_norm"]
    assert torch.allclose(saved["mean"], obs.mean(0)) and torch.allclose(
        saved["var"], obs.var(0, unbiased=False)
    )


@pytest.mark.e2e
def test_dataset_from_a_trained_checkpoint(workdir):
    """The behaviour policy comes from a run directory's newest checkpoint (PPO
    here); a policy trained on another env is refused."""
    trained = run_harness(["debug=tiny", "run_dir=ppo"], workdir)
    assert trained.returncode == 0, trained.stderr[-3000:]
    done = write_dataset(
        ["env=cartpole", "out=ds", "frames=300", "policy=ppo", "reference.expert_policy=ppo"],
        workdir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _, meta = dataset.load(workdir / "ds", "CartPole-v1")
    assert (
        meta.sources[0]["algo"] == "ppo"
        and meta.sources[0]["frames"] == 1024
        and "step-000000001024" in meta.sources[0]["policy"]
    )
    assert meta.expert_return is not None and meta.expert_return > 0
    wrong = write_dataset(["env=pendulum", "out=ds2", "frames=300", "policy=ppo"], workdir)
    assert (
        wrong.returncode != 0
        and "was trained on CartPole-v1, but env.id=Pendulum-v1" in wrong.stderr
    )
