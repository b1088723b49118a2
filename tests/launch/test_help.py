"""--help reads each setting's meaning from its declaration; a mistyped setting or option is told
the nearest one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from helpers import CONF
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from harness.algos.sac import SACConfig
from harness.cli.errors import explain
from harness.config import CollectorConfig, Config, LoggerConfig
from harness.config.help import field_docs, groups, settings, unknown_option, unknown_setting

pytestmark = pytest.mark.unit


@dataclass
class Example:
    plain: int = 1  # said on its line
    # said above it,
    # over two lines
    above: int = 2
    spread: list[int] = field(
        default_factory=list  # said inside a value that spans lines
    )
    silent: int = 3


def test_a_fields_meaning_is_its_comment_on_its_lines_or_the_comment_lines_right_above():
    docs = field_docs(Example)
    assert docs == {
        "plain": "said on its line",
        "above": "said above it, over two lines",
        "spread": "said inside a value that spans lines",
    }  # "silent": nothing to say


def test_every_setting_of_the_default_job_has_its_meaning():
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        cfg = compose("config", overrides=["algo=sac", "env=pendulum"])
    rows = {key: (value, doc) for key, value, doc in settings(cfg)}
    assert rows["algo.q_lr"] == ("0.001", "critics' (and alpha's) Adam learning rate")
    assert (
        rows["algo.batch_size"][1] == field_docs(SACConfig)["batch_size"]
    )  # inherited from OffPolicyConfig
    assert rows["collector.mode"][1].startswith("sync: in round r")  # comment lines above the field
    assert rows["logger.group"][1].startswith("wandb group")  # a default that spans lines
    undocumented = [key for key, (_, doc) in rows.items() if not doc and not key.endswith(".name")]
    assert undocumented == [], undocumented


def test_groups_are_the_command_lines_choices_only():
    found = groups()
    assert "common" not in found and "tuned" not in found
    assert found["algo"] == ["bc", "cql", "dqn", "iql", "ppo", "sac", "td3"]


def test_a_mistyped_setting_is_told_the_nearest_one_in_its_section():
    assert unknown_setting("algo.lrr", SACConfig.__mro__[0]).startswith(
        "algo.lrr: no such setting in algo"
    )
    assert "did you mean collector.num_envs?" in unknown_setting(
        "collector.num_env", CollectorConfig
    )
    assert "did you mean logger.backends?" in unknown_setting("logger.backend", LoggerConfig)
    assert "did you mean seed?" in unknown_setting("sead", Config)
    assert unknown_option("env", "cartpol").startswith(
        "env=cartpol: no such option; did you mean env=cartpole?"
    )


def test_hydras_error_for_a_typo_becomes_did_you_mean():
    with (
        initialize_config_dir(version_base=None, config_dir=str(CONF)),
        pytest.raises(ConfigCompositionException) as info,
    ):
        compose("config", overrides=["algo.lrr=1e-3"])
    assert (
        explain(info.value)
        == "algo.lrr: no such setting in algo; did you mean algo.lr? (--help lists every setting)"
    )
