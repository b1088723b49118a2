"""Moving a payload through a named shared-memory segment on one node.

Layout: a control block, then ``slots`` slots of one payload each::

    control  [latest slot, creator pid, slots, bell, version[0], ..., version[slots - 1]]
    slot i   packed payload

Every slot has a lock: an open-file-description record lock on byte ``i`` of
the segment (``fcntl`` ``F_OFD_SETLK``). The writer (one per segment) locks a
slot exclusively while it fills it, then points ``latest`` at it. It never
waits: it tries the slots other than ``latest``, oldest first, without
blocking, and takes the first that is free. A reader holds the lock of the
slot it uses, shared, until it moves to a newer one; with one slot per reader
plus two, a free slot always exists. After each write the writer rings the
bell (adds one to it and wakes its sleepers, :mod:`harness.sync.futex`): a
reader waiting for an update sleeps on the bell instead of polling.

A reader applies an update without copying it: it releases its slot, locks
the latest one and points its policy's parameters at that slot's bytes
(:meth:`Payload.alias`); the lock keeps the writer off the slot while the
policy reads it, so no update is ever seen torn. Readers apply between env
steps, never while acting. (With ``sync.wire_dtype`` other than float32 the
reader casts the slot into its own buffer instead.) Locks are kernel objects:
taking one orders memory like any system call, and a dead process's locks are
released with it, so a killed reader never pins a slot.

Segments (:mod:`harness.sync.shm_files`: names, memory, clean-up) are
created with mode 0600 (private to the user) and unlinked by the creator at
exit; if the creator was SIGKILLed, Python's resource tracker, a surviving
reader, or the next run's creator (which removes segments whose creator is
dead) does it.
"""

from __future__ import annotations

import _posixshmem
import errno
import fcntl
import mmap
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch
from tensordict import TensorDictBase

from harness.sync import futex
from harness.sync.contract import Header, PayloadFactory, SyncError
from harness.sync.digest import PendingDigest
from harness.sync.payload import Payload
from harness.sync.shm_files import alive, new_name, remove_stale_segments, reserve

LATEST, PID, SLOTS, BELL, VERSION = 0, 1, 2, 3, 4  # control words
CONTROL = VERSION  # control words before the per-slot versions
MAX_RETRIES = 1000
DEAD_WRITER_CHECK_S = 0.1  # a waiting reader notices a dead writer this soon


def _ofd_lock(fd: int, slot: int, kind: int) -> bool:
    """Set (``F_RDLCK`` / ``F_WRLCK``) or release (``F_UNLCK``) the lock on byte
    ``slot`` without blocking; False when another holder is in the way."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", kind, os.SEEK_SET, slot, 1, 0))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


class Segment:
    """A shared-memory segment of ``slots`` slots; see the module docstring.

    The creator uses ``SharedMemory``, which registers the segment with
    Python's resource tracker: if the creator is killed, the tracker unlinks
    it. Readers map it directly, unregistered, so that a reader's exit never
    removes a segment that others still use. Each end keeps its own file
    descriptor, which carries its locks.
    """

    def __init__(
        self, name: str, buf: memoryview, fd: int, slot_bytes: int, slots: int, owner: bool, closer
    ):
        self.name, self.fd, self.slot_bytes, self.owner, self._closer = (
            name,
            fd,
            slot_bytes,
            owner,
            closer,
        )
        self.control = np.ndarray((CONTROL + slots,), dtype=np.int64, buffer=buf)
        self.bell = self.control.ctypes.data + BELL * 8  # the address sleepers wait on
        offset, stride = self.control_bytes(slots), -(-slot_bytes // 64) * 64
        self.slots = [
            torch.frombuffer(buf, dtype=torch.uint8, count=slot_bytes, offset=offset + i * stride)
            for i in range(slots)
        ]
        self.nbytes = len(buf)
        self.registered = False  # page-locked for CUDA (pin_for_cuda)

    @staticmethod
    def control_bytes(slots: int) -> int:
        return -(-(CONTROL + slots) * 8 // 64) * 64

    @classmethod
    def size_for(cls, slot_bytes: int, slots: int) -> int:
        return cls.control_bytes(slots) + slots * (-(-slot_bytes // 64) * 64)

    @classmethod
    def create(cls, slot_bytes: int, slots: int, node: int) -> Segment:
        remove_stale_segments()
        name, size = new_name(node), cls.size_for(slot_bytes, slots)
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)  # mode 0600
        assert shm.buf is not None  # None only once closed
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            reserve(fd, name, size, slots)
        except SyncError:
            os.close(fd)
            shm.close()
            shm.unlink()
            raise
        segment = cls(name, shm.buf, fd, slot_bytes, slots, owner=True, closer=shm.close)
        segment.control[:] = -1  # no latest slot, every slot's version -1
        segment.control[PID], segment.control[SLOTS], segment.control[BELL] = os.getpid(), slots, 0
        return segment

    @classmethod
    def attach(cls, name: str, slot_bytes: int) -> Segment:
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as e:
            raise SyncError(
                f"shared-memory segment {name} does not exist (its writer exited?)"
            ) from e
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
            slots = (
                int(np.ndarray((CONTROL,), dtype=np.int64, buffer=mapping)[SLOTS])
                if size >= CONTROL * 8
                else 0
            )
            if slots < 1 or size < cls.size_for(slot_bytes, slots):
                mapping.close()
                raise SyncError(
                    f"shared-memory segment {name} holds {size} bytes, too few for {max(slots, 1)} "
                    f"slots of {slot_bytes}"
                )
        except BaseException:
            os.close(fd)
            raise
        return cls(
            name, memoryview(mapping), fd, slot_bytes, slots, owner=False, closer=mapping.close
        )

    def pin_for_cuda(self) -> bool:
        """Page-lock the mapping for CUDA (``cudaHostRegister``): a GPU
        trainer's weights then land in a slot with one full-speed
        device-to-host copy. False where the driver refuses; the copy still
        works then, through the driver's own staging, at a lower speed."""
        cudart, base = torch.cuda.cudart(), int(self.control.ctypes.data)
        self.registered = int(cudart.cudaHostRegister(base, self.nbytes, 0)) == 0
        if not self.registered:
            # The refusal stays behind as this thread's "last CUDA error", which torch would report
            # at its next kernel launch as that kernel's failure: consume it here with a launch of
            # our own.
            try:
                torch.ones(1, device=torch.cuda.current_device()).add_(1)
            except RuntimeError:
                pass
        return self.registered

    def lock(self, slot: int, kind: int) -> bool:
        return _ofd_lock(self.fd, slot, kind)

    def close(self) -> None:
        creator = int(self.control[PID])
        if self.registered:  # before the mapping goes
            torch.cuda.cudart().cudaHostUnregister(int(self.control.ctypes.data))
        os.close(self.fd)  # releases this end's locks
        self.slots, self.control = [], None  # release the views before closing the mapping
        try:
            self._closer()
        except BufferError:
            pass  # a policy still views a slot; the mapping goes with the process
        if self.owner or not alive(creator):  # a surviving reader cleans up after a dead writer
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass
            if self.owner:
                resource_tracker.unregister("/" + self.name, "shared_memory")


class ShmSink:
    """The writer of a node's segment, for ``readers`` readers (a
    :class:`~harness.sync.contract.Sink`)."""

    def __init__(self, node: int, readers: int):
        self.node, self.readers = node, readers
        self.segment: Segment | None = None
        self.slot_payloads: list[Payload] = []
        self._digest_thread: ThreadPoolExecutor | None = None  # sync.verify's, once it digests

    def open(self, make_payload: PayloadFactory) -> None:
        payload = make_payload()
        self.segment = Segment.create(payload.buffer.numel(), self.readers + 2, self.node)
        # A GPU trainer's (Publisher.connect pins its payloads): its weights land in the slots. A
        # process that never touched CUDA has no pinned memory, and asking would make it a CUDA
        # context: don't.
        if torch.cuda.is_initialized() and payload.buffer.is_pinned():
            self.segment.pin_for_cuda()
        self.slot_payloads = [payload.rebase(slot) for slot in self.segment.slots]

    def write(self, weights: TensorDictBase, header: Header) -> None:
        self.write_digesting(weights, header, None)

    def write_digesting(
        self, weights: TensorDictBase, header: Header, pending: PendingDigest | None
    ) -> None:
        """:meth:`write`, with the version's digest still to take (``pending``): a thread of its
        own takes it from the sender's weights while this one copies them into the slot (both
        read the weights; torch lets go of the GIL for each), and the header gets it last."""
        assert self.segment is not None  # open() made it
        segment, control = self.segment, self.segment.control
        latest = int(control[LATEST])
        others = sorted(
            (s for s in range(len(segment.slots)) if s != latest),
            key=lambda s: control[VERSION + s],
        )
        slot = next((s for s in others if segment.lock(s, fcntl.F_WRLCK)), None)
        if slot is None:
            raise SyncError(
                f"shared-memory segment {segment.name}: every slot is in use; it was made for "
                f"{self.readers} readers"
            )
        try:
            if pending is None:
                self.slot_payloads[slot].write(weights, header)
            else:
                digesting = self._digester().submit(lambda: pending.value)
                self.slot_payloads[slot].write(weights, header)
                self.slot_payloads[slot].write_header(replace(header, digest=digesting.result()))
            control[VERSION + slot] = header.version
        finally:
            segment.lock(slot, fcntl.F_UNLCK)
        control[LATEST] = slot
        control[BELL] += 1
        futex.wake(segment.bell)

    def _digester(self) -> ThreadPoolExecutor:
        if self._digest_thread is None:
            self._digest_thread = ThreadPoolExecutor(1, thread_name_prefix="shm-digest")
        return self._digest_thread

    def close(self) -> None:
        if self._digest_thread is not None:
            self._digest_thread.shutdown()
            self._digest_thread = None
        if self.segment is not None:
            self.slot_payloads = []
            self.segment.close()
            self.segment = None


class ShmSource:
    """A reader of a node's segment (a :class:`~harness.sync.contract.Source`)."""

    def __init__(self, poll_interval_s: float):
        self.poll_interval_s = poll_interval_s
        self.version = -1
        self.exhausted = False
        self.segment: Segment | None = None
        self.slot_payloads: list[Payload] = []
        self.pinned: int | None = None  # the slot whose lock we hold (the one the policy views)

    def attach(self, name: str) -> None:
        self.name = name

    def open(self, make_payload: PayloadFactory) -> None:
        template = make_payload()
        self.segment = Segment.attach(self.name, template.buffer.numel())
        self.slot_payloads = [template.rebase(slot) for slot in self.segment.slots]

    def _pin_latest(self) -> int:
        """Move our lock to the latest slot; the writer may retire it meanwhile, so retry."""
        assert self.segment is not None  # open() attached it
        if self.pinned is not None:
            self.segment.lock(self.pinned, fcntl.F_UNLCK)
            self.pinned = None
        control = self.segment.control
        for _ in range(MAX_RETRIES):
            slot = int(control[LATEST])
            if self.segment.lock(slot, fcntl.F_RDLCK):
                self.pinned = slot
                return slot
        raise SyncError(
            f"shared-memory segment {self.segment.name}: could not lock the latest slot "
            f"in {MAX_RETRIES} tries"
        )

    def poll_into(self, live: Payload) -> Header | None:
        assert self.segment is not None  # open() attached it
        control = self.segment.control
        latest = int(control[LATEST])
        if latest < 0 or int(control[VERSION + latest]) <= self.version:
            return None
        slot = self._pin_latest()
        payload = self.slot_payloads[slot]
        if live.schema == payload.schema:
            live.alias(payload)  # zero copy: the policy reads the locked slot
        else:
            live.copy_from(payload)  # another wire dtype: cast into our own buffer
        header = payload.header()
        self.version, self.exhausted = header.version, header.stop
        return header

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        assert self.segment is not None  # open() attached it
        start = time.monotonic()
        control, writer = self.segment.control, int(self.segment.control[PID])
        while True:
            # read before looking: a write after it makes the sleep return at once
            rung = int(control[BELL])
            header = self.poll_into(live)
            if header is not None:
                return header
            left = start + timeout_s - time.monotonic()
            if left <= 0:
                raise SyncError(
                    f"nothing new in shared-memory segment {self.segment.name} for "
                    f"{time.monotonic() - start:.1f} s"
                )
            if not alive(writer):  # a dead writer never writes again: fail now, not at the timeout
                raise SyncError(
                    f"the writer of shared-memory segment {self.segment.name} "
                    f"(pid {writer}) is dead"
                )
            # Sleep until the writer rings, waking every 0.1 s to check that it is alive.
            futex.wait(
                self.segment.bell, rung, min(left, DEAD_WRITER_CHECK_S), self.poll_interval_s
            )

    def close(self) -> None:
        if self.segment is not None:
            self.slot_payloads = []
            self.segment.close()
            self.segment = None
