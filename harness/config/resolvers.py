"""The resolvers ``conf/config.yaml`` names, registered with the config's schemas
(``harness.config.register_configs``)."""

from __future__ import annotations

import os
from typing import Optional

from omegaconf import OmegaConf

from harness.distributed.launch_stamp import launch_stamp


def sweep_name(run_name: Optional[str]) -> str:
    """A sweep's directory under ``runs_root``: ``run_name`` if given (the same sweep command then
    finds every job's run directory again, and resumes it), else ``sweep-<the launch's stamp>``,
    the same on every rank (:mod:`harness.distributed.launch_stamp`)."""
    return run_name or f"sweep-{launch_stamp()}"


def rank0_level() -> str:
    """The level of Hydra's own log lines ("Launching 2 jobs locally", "#1 : seed=2"): every rank
    runs Hydra, and only rank 0 talks, as the harness's own lines do."""
    return "INFO" if os.environ.get("RANK", "0") == "0" else "WARNING"


def register() -> None:
    """``harness.sweep_name`` is cached, as Hydra's ``now`` is, so that every job of a sweep, and a
    submitit launcher's jobs (the cache travels with their config), read the name the sweep began
    with."""
    OmegaConf.register_new_resolver("harness.sweep_name", sweep_name, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("harness.rank0_level", rank0_level, replace=True)
