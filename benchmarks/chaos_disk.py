"""The run directory's own disk, for benchmarks/chaos.py's ``disk_full`` and ``slow_disk``.

``disk_full`` alone: a tmpfs of ``--disk-mb``. With ``slow_disk``: an ext4 filesystem in a file of
``--disk-mb`` on a loop device, whose writes the kernel throttles while the fault lasts, through
the cgroup v1 blkio controller of the root group (``blkio.throttle.write_bps_device``, this
device's major:minor only): buffered writes, ``fsync`` and the journal alike, as a slow or
congested disk would. Both need root; a layout that cannot have its disk says why and its faults
are skipped. Device-mapper's ``delay`` target was the first choice, but this machine's kernel has
no device-mapper (``/dev/mapper/control`` does not exist and cannot be loaded: no modprobe).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos_report import rows_of

if TYPE_CHECKING:
    import argparse

    from chaos import Job

THROTTLE = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")


@dataclass
class Disk:
    """A filesystem mounted at ``path`` for the run directory: a tmpfs, or ext4 on ``loop``."""

    path: Path
    kind: str
    loop: str | None = None

    def throttle(self, bytes_per_s: int) -> None:
        """Writes to the loop device at most ``bytes_per_s`` (0: no limit)."""
        assert self.loop is not None  # only an ext4 disk is throttled
        numbers = Path(f"/sys/class/block/{Path(self.loop).name}/dev").read_text().strip()
        THROTTLE.write_text(f"{numbers} {bytes_per_s}\n")

    def unmount(self) -> None:
        if self.loop is not None:
            self.throttle(0)
        subprocess.run(["umount", str(self.path)], check=False)
        if self.loop is not None:
            subprocess.run(["losetup", "-d", self.loop], check=False)


def mount_disk(tmp: Path, args: argparse.Namespace) -> tuple[Disk | None, str | None]:
    """The run directory's disk when ``disk_full`` or ``slow_disk`` is in the schedule, or why
    there is none (not root, no loop device, no blkio throttle)."""
    if not {"disk_full", "slow_disk"} & set(args.kinds):
        return None, None
    disk = tmp / "disk"
    disk.mkdir()
    if "slow_disk" not in args.kinds:
        tmpfs = ["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", str(disk)]
        out = subprocess.run(tmpfs, capture_output=True, text=True)
        return (Disk(disk, "tmpfs"), None) if not out.returncode else (None, out.stderr.strip())
    if not THROTTLE.exists():
        return None, f"no {THROTTLE} (the cgroup v1 blkio controller) to throttle a disk with"
    image = tmp / "disk.img"
    with image.open("wb") as f:
        f.truncate(args.disk_mb * 2**20)
    steps = [
        ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
        ["losetup", "-f", "--show", str(image)],
    ]
    for step in steps:
        out = subprocess.run(step, capture_output=True, text=True)
        if out.returncode:
            return None, f"{' '.join(step)}: {out.stderr.strip()}"
    loop = out.stdout.strip()
    out = subprocess.run(["mount", loop, str(disk)], capture_output=True, text=True)
    if out.returncode:
        subprocess.run(["losetup", "-d", loop], check=False)
        return None, f"mount {loop}: {out.stderr.strip()}"
    return Disk(disk, f"ext4 on {loop}", loop), None


def slow_disk_fault(job: Job, args: argparse.Namespace) -> dict[str, Any]:
    """The run directory's disk throttled to ``--slow-bps`` until the next checkpoint is written
    (the trainer's line says how long it took), then freed; whole again at the next row."""
    if job.disk is None or job.disk.loop is None:
        return {"skipped": f"no disk to throttle: {job.no_disk}"}
    at = time.monotonic()
    job.disk.throttle(args.slow_bps)
    try:
        noticed = job.wait_line(r"checkpoint: .*MiB in [\d.]+ s\)", at, 180)
    finally:
        job.disk.throttle(0)
    record: dict[str, Any] = {
        "target": f"{job.disk.kind}, writes at {args.slow_bps} B/s",
        "at": at,
        "noticed": noticed,
    }
    if noticed and (took := re.search(r"in ([\d.]+) s\)", noticed[1])):
        record["checkpoint_s"] = float(took[1])
        record["whole"] = next_row(job)
    return record


def next_row(job: Job) -> tuple[float, str] | None:
    """When ``metrics.csv`` grew by a row from now."""
    count = len(rows_of(job.run))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(rows_of(job.run)) > count:
            return time.monotonic(), "the next row after the checkpoint"
        time.sleep(0.2)
    return None
