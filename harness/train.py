"""The entry point: one process per rank.

    torchrun --nproc_per_node=3 -m harness.train            # 1 trainer + 2 collectors
    torchrun --nproc_per_node=3 -m harness.train sync=none seed=3 collector.total_frames=100000
    python -m harness.train debug=tiny                      # world size 1: trains and collects
    srun --ntasks=3 python -m harness.train                 # SLURM starts the ranks (no torchrun)
    python -m harness.train -m hydra/launcher=submitit_slurm seed=1,2   # a SLURM job per seed

Compose and validate the config, find this rank's role, make the process
groups and the shared run directory, run the role's loop, shut down cleanly.
"""

from __future__ import annotations

from harness.distributed import signals

if __name__ == "__main__":
    # `python -m harness.train` (torchrun's workers, srun's tasks): a Ctrl-C while torch and Hydra
    # import (seconds) ends the process at once, without a traceback from every rank. A program
    # that imports this module keeps its own handler.
    signals.quiet_interrupt()

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.cli import errors as cli
from harness.config import Config, load, register_configs
from harness.data import dataset
from harness.distributed.placement import Placement, check_devices, describe_all, place
from harness.distributed.setup import (
    Groups,
    init_distributed,
    resolve_run_dir,
    shutdown_distributed,
)
from harness.distributed.topology import Layout, slurm_env
from harness.roles.kinds import kind_for, reward_normalizer
from harness.roles.trainer import run_trainer
from harness.rundir import directory as run_directory
from harness.rundir import lock as run_lock
from harness.sync import SCHEMES

log = logging.getLogger("harness")
CONF = Path(__file__).resolve().parents[1] / "conf"  # hydra.main's config_path


def check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RuntimeError(
            f"run_dir {run_dir} is not writable ({e.strerror}): pick another with run_dir=PATH"
        ) from e


def check_dataset(cfg: Config) -> None:
    """An offline run's dataset directory: on every rank, before any process
    group, so that a missing, mismatched or changed one (its bytes against the digest its
    meta.json recorded) stops the job at once. (A Minari dataset is read when the trainer
    starts.)"""
    if cfg.dataset and not cfg.dataset.startswith("minari:"):
        data, meta = dataset.load(cfg.dataset, cfg.env.id)
        dataset.check_digest(cfg.dataset, data, meta)
        reward_normalizer(cfg, meta)  # a dataset it cannot scale by: refused here, on every rank


def claim(layout: Layout, run_dir: Path) -> run_lock.RunLock | None:
    """Trainer 0 checks that the run directory is one (new, empty or a run's)
    and takes its lock, before anything is written there; every rank learns
    whether it did, so that a refused launch ends on every rank with trainer
    0's reason, and none of them touches a file."""
    lock: run_lock.RunLock | None = None
    refusal: list[str | None] = [None]
    if layout.rank == 0:
        try:
            run_directory.refuse_foreign(run_dir)  # before the lock file is made in it
            lock = run_lock.take(run_dir)
        except (run_directory.RunDirError, run_lock.RunLockError) as e:
            refusal = [str(e)]
            if layout.single_process:
                raise
    if not layout.single_process:
        dist.broadcast_object_list(refusal, src=0)
    if refusal[0] is not None:
        raise run_lock.RunLockError(refusal[0])
    return lock


def open_run_dir(
    cfg: Config, raw: DictConfig, layout: Layout, run_dir: Path
) -> run_lock.RunLock | None:
    """Lock, check and prepare the run directory; returns trainer 0's lock."""
    lock = claim(layout, run_dir)
    try:
        # Every rank, before anything is written: a refused launch changes nothing.
        if run_directory.check(cfg, raw, run_dir, layout):
            cfg.checkpoint.resume = True  # an earlier attempt of this launch ran here: continue it
        if not layout.single_process:
            # Every rank has checked before rank 0 writes config.yaml: a rank that checks later
            # (32 ranks start seconds apart) would take this launch's own file for an earlier run's.
            dist.barrier()
        if layout.rank == 0:
            check_writable(run_dir)
            assert lock is not None  # claim() took it on trainer 0
            lock.announce()  # accepted: from here on this launch writes
            run_directory.prepare(cfg, raw, run_dir, layout)
    except BaseException:
        if lock is not None:  # a sweep's next job in this process may want it
            lock.release()
        raise
    return lock


def sweep_defaults(cfg: Config) -> int:
    """What Hydra knows and the config does not: a multirun job's own directory
    (``hydra.sweep.dir``/``subdir``) as its default run directory, and the
    experiment preset's name as the default wandb group, which a sweep's runs share.
    Returns the sweep job's number (0 outside a sweep): the ranks meet anew for each job."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if not cfg.run_dir and multirun:
        cfg.run_dir = hydra_cfg.runtime.output_dir
    cfg.logger.group = (
        cfg.logger.group or hydra_cfg.runtime.choices.get("experiment") or cfg.algo_env
    )
    return hydra_cfg.job.num if multirun else 0


def tuned_settings(raw: DictConfig) -> str | None:
    """What ``conf/config.yaml``'s ``optional tuned: ${algo}_${env}`` set, said where it applies:
    the file, and each value it holds (with the one in force where a preset or the command line
    overrode it), so that no hyper-parameter changes unseen. None where no tuned file matches."""
    name = HydraConfig.get().runtime.choices.get("tuned")
    path = CONF / "tuned" / f"{name}.yaml"
    if not name or not path.exists():
        return None
    tuned = OmegaConf.load(path)
    settings = []
    for key in sorted(_leaf_keys(tuned)):
        value, now = OmegaConf.select(tuned, key), OmegaConf.select(raw, key)
        settings.append(
            f"{key}={now}" if now == value else f"{key}={now} (tuned: {value}, overridden)"
        )
    return f"conf/tuned/{name}.yaml (tuned for this algo and env) set: {', '.join(settings)}"


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, DictConfig):
        return [prefix.rstrip(".")]
    return [
        k
        for key, child in node.items_ex(resolve=False)
        for k in _leaf_keys(child, f"{prefix}{key!s}.")
    ]


def run_role(cfg: Config, layout: Layout, groups: Groups | None, run_dir: Path) -> None:
    """This rank's role, to its end: a trainer; else what the run's kind has collectors do
    (collect, or in an offline run only evaluate). On a failure, what the failed call stack holds
    is freed before ``main`` destroys the process groups: else the last reference to the
    trainers' group can be DDP's reducer's, whose destructor holds the GIL while it joins gloo's
    worker thread, which may be waiting for the GIL (the process hangs at exit)."""
    try:
        kind = kind_for(cfg)
        if layout.is_trainer:
            run_trainer(cfg, layout, groups, run_dir, kind)
        else:
            assert groups is not None  # a collector is never the only rank
            kind.collector_role(cfg, layout, groups)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise


def read_config(raw: DictConfig) -> tuple[Config, Layout, int]:
    """The config, every value checked before any process group exists, this rank's place in the
    job, and the sweep job's number (:func:`sweep_defaults`). A mistake in the command is said
    once, by rank 0, without a traceback."""
    with cli.user_errors():
        cfg = load(raw)
        check_dataset(cfg)
        sweep_job = sweep_defaults(cfg)
        # srun without torchrun: the ranks from SLURM's variables.
        os.environ.update(slurm_env(os.environ))
        layout = Layout.from_env(cfg.topology.trainers)
        check_devices(
            cfg.trainer.device,
            cfg.collector.device,
            SCHEMES[cfg.sync.name].gpu_collectors,
            cfg.sync.name,
            layout.single_process,
        )
    return cfg, layout, sweep_job


def place_rank(cfg: Config, layout: Layout) -> Placement:
    """This rank's device and threads, applied before any process group (NCCL binds to the
    current device); a trainer's resolved device (cuda:<i> or cpu) is where its algorithm lives.
    Each rank checks its own role's device: the first rank of that role on the node says what is
    wrong."""
    with cli.user_errors(speaker=layout.rank == layout.first_of_role_on_node):
        placement = place(
            layout,
            cfg.trainer.device,
            cfg.collector.device,
            cfg.trainer.threads,
            cfg.collector.threads,
            SCHEMES[cfg.sync.name].gpu_collectors,
            cfg.sync.name,
            fast_cuda=cfg.trainer.fast_cuda,
        )
    placement.apply()
    if layout.is_trainer:
        cfg.trainer.device = placement.device
    if layout.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)  # only trainer 0 talks
    return placement


def connect_ranks(
    cfg: Config, layout: Layout, placement: Placement, sweep_job: int
) -> Groups | None:
    """The job's process groups (none in a single process). The scheme's own groups wait as long
    as the harness's longest wait on the weights."""
    if layout.single_process:
        return None
    wait_s = max(cfg.dist_timeout_s, cfg.sync.timeout_s)
    scheme = SCHEMES[cfg.sync.name]
    return init_distributed(
        layout, cfg.dist_timeout_s, scheme, placement.cuda_device, wait_s, sweep_job
    )


def settle_run_dir(cfg: Config, layout: Layout) -> Path:
    """The run directory, resolved the same on every rank (collectors write videos there) and
    written into ``cfg.run_dir``."""
    default_name = f"{cfg.algo_env}-seed{cfg.seed}"
    run_dir = resolve_run_dir(cfg.run_dir, cfg.runs_root, cfg.run_name, default_name, layout)
    run_dir = run_dir.resolve()
    cfg.run_dir = str(run_dir)
    return run_dir


def announce(raw: DictConfig, layout: Layout, placement: Placement, run_dir: Path) -> None:
    """Trainer 0 says where the run goes, the ranks and where each computes, and what a tuned
    file set. Every rank takes part in gathering the placements, and none reads ``run_dir``
    before trainer 0 prepared it."""
    placements = describe_all(placement, not layout.single_process)
    if layout.rank == 0:
        log.info("run_dir: %s", run_dir)
        log.info("%s\n%s", layout.describe(), placements)
        if tuned := tuned_settings(raw):
            log.info("%s", tuned)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    # A scheduler's SIGTERM during start-up: stop at the first safe point, as later. Ctrl-C still
    # stops at once, as during the imports (this module's first lines).
    signals.install(interrupt=False)
    cfg, layout, sweep_job = read_config(raw)
    placement = place_rank(cfg, layout)
    lock = None
    try:
        groups = connect_ranks(cfg, layout, placement, sweep_job)
        run_dir = settle_run_dir(cfg, layout)
        # A run directory that is not this run's: refused on every rank, said by rank 0.
        with cli.user_errors():
            lock = open_run_dir(cfg, raw, layout, run_dir)
        announce(raw, layout, placement, run_dir)
        # From here on a first Ctrl-C, too, means: checkpoint at the next safe point, then exit
        # (SIGTERM and SIGUSR1 meant it from the start). Before, during start-up, it stops the
        # process at once.
        signals.install(announce=layout.rank == 0)
        run_role(cfg, layout, groups, run_dir)
    finally:
        shutdown_distributed()
        if lock is not None:
            lock.release()
    if signals.interrupted() and "TORCHELASTIC_RUN_ID" not in os.environ:
        # The shell's "ended by Ctrl-C". Under torchrun the launcher says it:
        # there, a worker's non-zero exit would read as a failure to restart.
        sys.exit(128 + 2)


HELP = """\
Train a policy: trainer ranks learn, collector ranks step the envs; Hydra composes the config.

  harness train [overrides]                         3 ranks (1 trainer + 2 collectors);
                                                    --nproc 1: one process
  harness train -m seed=1,2,3 [overrides]           a sweep: one run after another, each in its
                                                    own directory
  harness train experiment=sac_pendulum --help      the settings that command would run with

An override is group=option (a file of conf/<group>/) or key=value (a setting below).
--hydra-help lists Hydra's own flags; --cfg job prints the composed config."""

if __name__ == "__main__":
    # The schemas, before Hydra composes the command line; a HARNESS_PLUGINS module that does not
    # import is a mistake in the command, said once.
    with cli.user_errors():
        register_configs()
    cli.run(main, "config", HELP)
