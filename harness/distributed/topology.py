"""Who does what: the role of every rank, from torchrun's environment.

Ranks ``0 .. T-1`` train (``T = topology.trainers``); every other rank
collects. Collector ``c`` (counting from 0) feeds trainer ``c % T``. World
size 1 is the debugging mode: the single rank trains and collects.

Without torchrun, ``srun python -m harness.train`` starts every rank itself;
:func:`slurm_env` then gives each one torchrun's variables, read from SLURM's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[03-05,9],gpu1`` -> ``node03``."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]+)\]([^,]*))?", nodelist)
    assert match is not None  # the pattern matches any string
    prefix, ranges, suffix = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def tasks_per_node(spec: str) -> list[int]:
    """SLURM's tasks-per-node list expanded: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"cannot read SLURM's tasks per node {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_env(env: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables for a rank that ``srun`` started itself, read from
    SLURM's: ``SLURM_PROCID``, the step's task count, ``SLURM_LOCALID``,
    ``SLURM_NODEID``, and the step's first node as the rendezvous host (where
    rank 0 runs, as srun places tasks node by node). The port is
    ``MASTER_PORT`` if set, else one derived from the job and step ids, so
    that two jobs sharing a node do not meet. Empty when torchrun started this
    process (its variables win) or no srun step did."""
    if "RANK" in env or "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return {}
    node = int(env.get("SLURM_NODEID", 0))
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env["SLURM_STEP_NUM_TASKS"]))
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    job, step = (
        int(v) if v.isdigit() else 0
        for v in (env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0"))
    )
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(per_node[min(node, len(per_node) - 1)]),
        "GROUP_RANK": str(node),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodes),
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + (job * 7 + step) % 20000),
    }


class LayoutError(ValueError):
    """A role layout that cannot work, with the layout asked for and a fix."""


@dataclass(frozen=True)
class Layout:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    trainers: int
    local_world_size: int = 1  # ranks on this node

    @classmethod
    def from_env(cls, trainers: int, env: Mapping[str, str] | None = None) -> Layout:
        """Read torchrun's variables (all absent: a plain ``python`` run)."""
        env = os.environ if env is None else env
        layout = cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            # torchrun calls the node rank GROUP_RANK; SLURM's srun NODEID.
            node_rank=int(env.get("GROUP_RANK", env.get("SLURM_NODEID", 0))),
            trainers=trainers,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))),
        )
        layout.validate()
        return layout

    def validate(self) -> None:
        if self.trainers < 1:
            raise LayoutError(
                f"topology.trainers={self.trainers}: at least one rank must train.\n"
                f"{self.describe()}"
            )
        if self.world_size == 1:
            if self.trainers != 1:
                raise LayoutError(
                    f"topology.trainers={self.trainers} but this is a single-process run "
                    "(world size 1).\n"
                    "Fix: set topology.trainers=1, or launch "
                    f"{self.trainers + 1}+ ranks with torchrun."
                )
            return
        if self.trainers >= self.world_size:
            raise LayoutError(
                f"topology.trainers={self.trainers} with world size {self.world_size} leaves no "
                f"rank to collect.\n{self.describe()}\n"
                "Fix: launch more ranks "
                f"(harness train --nproc {self.trainers + 1}, or torchrun "
                f"--nproc_per_node={self.trainers + 1}) or lower topology.trainers."
            )
        collectors = self.world_size - self.trainers
        if self.trainers > 1 and collectors % self.trainers:
            raise LayoutError(
                f"{collectors} collectors cannot feed {self.trainers} trainers equally "
                f"(data-parallel trainers need equal batches).\n{self.describe()}\nFix: launch "
                f"{self.trainers + self.trainers * max(collectors // self.trainers, 1)} ranks, or "
                "change topology.trainers."
            )
        if not 0 <= self.rank < self.world_size:
            raise LayoutError(f"RANK={self.rank} is outside WORLD_SIZE={self.world_size}")

    @property
    def single_process(self) -> bool:
        return self.world_size == 1

    @property
    def is_trainer(self) -> bool:
        return self.rank < self.trainers

    @property
    def role(self) -> str:
        if self.single_process:
            return "trainer+collector"
        return "trainer" if self.is_trainer else "collector"

    @property
    def collector_ranks(self) -> list[int]:
        return list(range(self.trainers, self.world_size))

    @property
    def node_ranks(self) -> range:
        """The ranks on this node (torchrun numbers a node's ranks contiguously)."""
        first = self.rank - self.local_rank
        return range(first, first + self.local_world_size)

    @property
    def first_of_role_on_node(self) -> int:
        """The lowest rank on this node with this rank's role (who speaks for a check only that role
        makes)."""
        return min(r for r in self.node_ranks if (r < self.trainers) == self.is_trainer)

    def trainer_of(self, collector_rank: int) -> int:
        return (collector_rank - self.trainers) % self.trainers

    def collectors_of(self, trainer_rank: int) -> list[int]:
        return [c for c in self.collector_ranks if self.trainer_of(c) == trainer_rank]

    def describe(self) -> str:
        """The layout asked for, one line per role."""
        trainers = f"ranks 0..{self.trainers - 1}" if self.trainers > 1 else "rank 0"
        collectors = self.collector_ranks
        cols = (
            f"ranks {collectors[0]}..{collectors[-1]}"
            if len(collectors) > 1
            else (f"rank {collectors[0]}" if collectors else "none")
        )
        return (
            f"layout asked for: world size {self.world_size}, topology.trainers={self.trainers}\n"
            f"  trainers:   {trainers}\n  collectors: {cols}"
        )
