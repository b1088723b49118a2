"""One owner per run directory: ``<run_dir>/.lock``, held with ``fcntl.flock``.

Trainer 0 takes the lock before it writes anything in the run directory and
holds it until the process ends. A second launch on the same directory finds
it held and is refused, naming the holder's host and pid, which the holder
writes into the file once its launch is accepted (:meth:`RunLock.announce`:
after the run directory's checks, so that a launch refused by them, a resume
with other settings say, changes no byte of it either); a refused launch only
opens the file and reads it. Until the holder announces itself, the file may
still name the launch before it. The kernel releases a flock when the
last descriptor of it closes, which includes the owner's death by any signal:
a crash never leaves a run directory locked, and a restarted attempt (torchrun
``--max-restarts``, a SLURM requeue) takes it again.

Limits: the descriptor is close-on-exec, but a child forked without exec
would share it and keep the lock while it lives. On NFS, Linux turns flock
into a POSIX byte-range lock, which the server arbitrates between nodes; a
filesystem without locks (some FUSE mounts) refuses with ``ENOLCK``, which
is reported as such.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".lock"


class RunLockError(ValueError):
    """A run directory that another launch owns, or that cannot be locked."""


class RunLock:
    """The held lock of one run directory; :meth:`release` (or the process's end) lets it go."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def announce(self) -> None:
        """Write this process's host and pid into the lock file, for a launch refused meanwhile
        to name (once this launch is accepted: a refused one leaves the file as it was)."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, holder_line().encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = -1


def holder_line() -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return f"host {socket.gethostname()} pid {os.getpid()} since {since}\n"


def read_holder(fd: int) -> str:
    """What the holder wrote: plain text, shown as is (printable characters only, bounded)."""
    text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    text = "".join(c for c in text if c.isprintable())
    return text or "it has not written its host and pid yet: it is starting up"


def take(run_dir: Path) -> RunLock:
    """Lock ``run_dir`` (made if missing) for this process, or raise
    :class:`RunLockError` naming the launch that holds it."""
    path = run_dir / LOCK_NAME
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC: a launch that finds the lock held must not change the holder's line.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunLockError(
            f"run_dir {run_dir} is not writable ({e.strerror}): pick another with run_dir=PATH"
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = read_holder(fd) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else ""
        os.close(fd)
        if not holder:
            raise RunLockError(
                f"run_dir {run_dir} cannot be locked ({e.strerror}): its filesystem has no file "
                "locks, so two launches could mix their files there. Put the run directory on "
                "another filesystem (run_dir=PATH)"
            ) from e
        raise RunLockError(
            f"run_dir {run_dir} is in use by another launch ({holder}; {path}). Two launches in "
            "one run directory would mix their metrics and checkpoints: wait for that one to end "
            "or stop it, or use another run_dir="
        ) from None
    return RunLock(fd, path)
