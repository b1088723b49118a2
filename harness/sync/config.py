"""The ``sync`` config section (``conf/sync/*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.sync import SCHEMES
from harness.sync.digest import VERIFY

WIRE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


@dataclass
class SyncConfig:
    """How policy weights reach the collectors; see docs/weight_sync.md."""

    name: str = "gloo"  # gloo | nccl | shm | hierarchical | none
    # longest wait for an update, and the longest allowed gap between publishes
    timeout_s: float = 60.0
    # trainer 0 names, in its log, a receiver that has kept a version's broadcast waiting this long
    # (a stopped or stalled collector rank), and the wait goes on up to timeout_s; 0: never
    late_s: float = 30.0
    # bfloat16 halves the bytes of float32 weights, at bfloat16's precision
    wire_dtype: str = "float32"
    # shm readers where there is no futex (sync/futex.py): sleep between checks while waiting
    poll_interval_s: float = 0.0002
    # async mode: trainer 0 publishes after this many updates (sync mode: every round)
    publish_every_updates: int = 1
    # broadcasts move the weights in buckets of this many MiB (0: in one piece): the trainer holds
    # two buckets instead of a second full copy (harness/sync/broadcast.py; docs/weight_sync.md)
    bucket_mb: float = 32.0
    # collectors check each applied version against its digest: off | sample (every 8th) | every
    verify: str = "sample"

    def __post_init__(self) -> None:
        if self.name not in SCHEMES:
            raise ValueError(
                f"sync={self.name!r} is not a weight sync scheme; choose one of {sorted(SCHEMES)}"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"sync.timeout_s must be > 0, got {self.timeout_s}")
        if self.late_s < 0:
            raise ValueError(
                f"sync.late_s must be >= 0 (0: never name a late receiver), got {self.late_s}"
            )
        if self.poll_interval_s < 0:
            raise ValueError(
                "sync.poll_interval_s must be >= 0 (seconds a shm reader sleeps between checks), "
                f"got {self.poll_interval_s}"
            )
        if self.publish_every_updates < 1:
            raise ValueError(
                f"sync.publish_every_updates must be >= 1, got {self.publish_every_updates}"
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(
                f"sync.wire_dtype={self.wire_dtype!r}: choose one of {sorted(WIRE_DTYPES)}"
            )
        if self.bucket_mb < 0:
            raise ValueError(f"sync.bucket_mb must be >= 0 (0: one piece), got {self.bucket_mb}")
        if self.verify not in VERIFY:
            raise ValueError(f"sync.verify={self.verify!r}: choose one of {list(VERIFY)}")
        if self.name == "nccl" and not torch.cuda.is_available():
            raise ValueError(
                "sync=nccl needs CUDA on every rank, and this rank has none: use sync=gloo (a GPU "
                "trainer with CPU collectors also uses sync=gloo, through pinned CPU staging)"
            )

    @property
    def bucket_bytes(self) -> int:
        """``bucket_mb`` in bytes, a multiple of 8 (0: one piece)."""
        return int(self.bucket_mb * 2**20) // 8 * 8

    @property
    def torch_wire_dtype(self) -> torch.dtype | None:
        """The dtype float32 weights travel as; None: as they are."""
        return WIRE_DTYPES[self.wire_dtype]
