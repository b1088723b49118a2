"""Moving a payload through a named shared-memory segment on one node.

Layout: a 64-byte control block, then two slots of one payload each::

    control  [latest slot, seq[0], seq[1], version[0], version[1], creator pid]
    slot 0   packed payload
    slot 1   packed payload

The writer (one per segment) fills the slot that readers are *not* told to
read, bracketed by its sequence number (odd while writing), then points
``latest`` at it: it never waits for a reader. A reader copies the latest slot
straight into its live buffer and keeps the copy only if the slot's sequence
number did not move meanwhile (a seqlock); otherwise it copies again. Readers
apply between env steps, so a retried copy is never acted on.

Segments are named ``harness-<uid>-<creator pid>-<token>-n<node>``, created
with mode 0600 (private to the user) and unlinked by the creator at exit; if
the creator was SIGKILLed, Python's resource tracker, a surviving reader, or
the next run's creator (which removes segments whose creator is dead) does it.

Ordering relies on x86-64's total store order for the control words (aligned
8-byte stores and loads are atomic there and not reordered among themselves).
"""

from __future__ import annotations

import _posixshmem
import mmap
import os
import secrets
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tensordict import TensorDict

from harness.sync.contract import Header, Payload, SyncError

CONTROL_BYTES = 64
LATEST, SEQ, VERSION, PID = 0, 1, 3, 5
PREFIX = f"harness-{os.getuid()}-"
MAX_RETRIES = 1000
SPIN_S = 0.001


def _alive(pid: int) -> bool:
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
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


class Segment:
    """A two-slot shared-memory segment; see the module docstring.

    The creator uses ``SharedMemory``, which registers the segment with
    Python's resource tracker: if the creator is killed, the tracker unlinks
    it. Readers map it directly, unregistered, so that a reader's exit never
    removes a segment that others still use.
    """

    def __init__(self, name: str, buf: memoryview, slot_bytes: int, owner: bool, closer):
        self.name, self.slot_bytes, self.owner, self._closer = name, slot_bytes, owner, closer
        self.control = np.ndarray((CONTROL_BYTES // 8,), dtype=np.int64, buffer=buf)
        stride = -(-slot_bytes // 64) * 64
        self.slots = [
            torch.frombuffer(buf, dtype=torch.uint8, count=slot_bytes, offset=CONTROL_BYTES + i * stride) for i in (0, 1)
        ]

    @staticmethod
    def size_for(slot_bytes: int) -> int:
        return CONTROL_BYTES + 2 * (-(-slot_bytes // 64) * 64)

    @classmethod
    def create(cls, slot_bytes: int, node: int) -> "Segment":
        remove_stale_segments()
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-n{node}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=cls.size_for(slot_bytes))  # mode 0600
        segment = cls(name, shm.buf, slot_bytes, owner=True, closer=shm.close)
        segment.control[:] = 0
        segment.control[LATEST] = -1
        segment.control[PID] = os.getpid()
        return segment

    @classmethod
    def attach(cls, name: str, slot_bytes: int) -> "Segment":
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as e:
            raise SyncError(f"shared-memory segment {name} does not exist (its writer exited?)") from e
        try:
            size = os.fstat(fd).st_size
            if size < cls.size_for(slot_bytes):
                raise SyncError(f"shared-memory segment {name} holds {size} bytes; the payload needs {cls.size_for(slot_bytes)}")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, memoryview(mapping), slot_bytes, owner=False, closer=mapping.close)

    def close(self) -> None:
        creator = int(self.control[PID])
        self.slots, self.control = [], None  # release the views before closing the mapping
        try:
            self._closer()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with the process
        if self.owner or not _alive(creator):  # a surviving reader cleans up after a dead writer
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass
            if self.owner:
                resource_tracker.unregister("/" + self.name, "shared_memory")


class ShmSink:
    """The writer of a node's segment."""

    def __init__(self, node: int):
        self.node = node
        self.segment: Segment | None = None

    def open(self, make_payload: Callable[[], Payload]) -> None:
        payload = make_payload()
        self.segment = Segment.create(payload.buffer.numel(), self.node)
        self.slot_payloads = [payload.rebase(slot) for slot in self.segment.slots]

    def write(self, weights: TensorDict, header: Header) -> None:
        control = self.segment.control
        slot = 1 - int(control[LATEST]) if control[LATEST] >= 0 else 0
        control[SEQ + slot] += 1  # odd: being written
        self.slot_payloads[slot].write(weights, header)
        control[VERSION + slot] = header.version
        control[SEQ + slot] += 1  # even: complete
        control[LATEST] = slot

    def close(self) -> None:
        if self.segment is not None:
            self.slot_payloads = []
            self.segment.close()
            self.segment = None


class ShmSource:
    """A reader of a node's segment."""

    def __init__(self, poll_interval_s: float):
        self.poll_interval_s = poll_interval_s
        self.version = -1
        self.exhausted = False
        self.segment: Segment | None = None

    def attach(self, name: str) -> None:
        self.name = name

    def open(self, make_payload: Callable[[], Payload]) -> None:
        self.staging = make_payload()
        self.segment = Segment.attach(self.name, self.staging.buffer.numel())
        self.slot_payloads = [self.staging.rebase(slot) for slot in self.segment.slots]

    def poll_into(self, live: Payload) -> Header | None:
        control = self.segment.control
        for _ in range(MAX_RETRIES):
            slot = int(control[LATEST])
            if slot < 0 or int(control[VERSION + slot]) <= self.version:
                return None
            seq = int(control[SEQ + slot])
            if seq % 2:
                continue  # the writer lapped us and is rewriting this slot
            live.copy_from(self.slot_payloads[slot])
            if int(control[SEQ + slot]) == seq:
                header = live.header()
                self.version, self.exhausted = header.version, header.stop
                return header
        raise SyncError(f"shared-memory segment {self.segment.name}: no consistent read in {MAX_RETRIES} tries")

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        start = last_check = time.monotonic()
        writer = int(self.segment.control[PID])
        while True:
            header = self.poll_into(live)
            if header is not None:
                return header
            now = time.monotonic()
            if now - start > timeout_s:
                raise SyncError(f"nothing new in shared-memory segment {self.segment.name} for {timeout_s:g} s")
            if now - last_check > 0.1:  # a dead writer never writes again: fail now, not at the timeout
                if not _alive(writer):
                    raise SyncError(f"the writer of shared-memory segment {self.segment.name} (pid {writer}) is dead")
                last_check = now
            # Spin (yielding the core) for the first millisecond: an update that is
            # being written lands within it; then sleep between checks.
            if now - start < SPIN_S:
                os.sched_yield()
            else:
                time.sleep(self.poll_interval_s)

    def close(self) -> None:
        if self.segment is not None:
            self.slot_payloads = []
            self.segment.close()
            self.segment = None
