"""The harness's files in ``/dev/shm``: their names, the memory they take,
and the clean-up after creators that died (see :mod:`harness.sync.shared_memory`).

Names are ``harness-<uid>-p<pid namespace>-<creator pid>-<token>-n<node>``.
The creator's pid and a random token make a name unique among all the nodes
that share a ``/dev/shm`` (simulated nodes on one kernel, containers started
with ``--ipc=host``); the pid namespace in the prefix keeps the clean-up to
segments whose creator it can see: a pid from another namespace says nothing
about whether that creator is alive.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from harness.sync.contract import SyncError


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


PREFIX = f"harness-{os.getuid()}-p{_pid_namespace()}-"


def new_name(node: int) -> str:
    """A segment name for node ``node``, unique on this machine."""
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-n{node}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_segments(shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Unlink this user's harness segments whose creator process is dead."""
    removed = []
    for path in shm_dir.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def reserve(fd: int, name: str, size: int, slots: int) -> None:
    """Take the segment's memory now: a segment larger than what ``/dev/shm``
    has left would otherwise be created all the same and kill its writer with
    SIGBUS at the first write past the end of the space."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        stat = os.statvfs("/dev/shm")
        raise SyncError(
            f"shared-memory segment {name} needs {size / 2**20:,.0f} MiB ({slots} slots: one per "
            "collector of the node plus two) and /dev/shm has "
            f"{stat.f_bavail * stat.f_frsize / 2**20:,.0f} MiB free. Fix: a larger /dev/shm "
            "(docker run --shm-size=...), sync.wire_dtype=bfloat16 (half the bytes), or sync=gloo"
        ) from e
