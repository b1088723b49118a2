"""Moving a payload with a collective broadcast (Gloo or NCCL), in pieces.

The sink is trainer 0's end; a source is a receiver's end, which keeps the
receives of one whole version posted into a staging payload at all times so
that the broadcast lands while the collector steps its envs.

A version travels as a series of broadcasts (:meth:`Payload.pieces`): the
weights in buckets of ``sync.bucket_mb``, the header with the last. Where the sender's
weights are packed as the payload lays them out (the algorithms pack what
they publish), the sink streams them: it copies bucket k into one of two
bucket buffers while bucket k - 1 travels from the other, so the trainer
never holds a second full copy of the weights, only two buckets; the publish
returns once the last bucket is copied. Otherwise (a cast to
``sync.wire_dtype``, an unpacked plugin model) it stages the whole payload
first, and returns at once. Receivers need the whole version before they
apply it (never torn): their staging payload is a full copy by design.

A broadcast completes once every receiver has posted its receive, which it
does when it applied the one before; so each source marks the version it applied in a roll call
(:mod:`harness.distributed.roll_call`), and a sink whose broadcast timed out
names the receivers that had not applied the previous one.
"""

from __future__ import annotations

import gc
import itertools
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist
from tensordict import TensorDictBase

from harness.core.packing import flat_region
from harness.distributed.roll_call import RollCall, ranks_text
from harness.distributed.waits import LateWatch, Wait
from harness.sync.contract import Endpoint, Header, PayloadFactory, SyncError
from harness.sync.digest import DigestPlan, PendingDigest, wrap
from harness.sync.payload import Payload, stamp

log = logging.getLogger("harness")
# the roll call of the versions receivers applied (keys: APPLIED/<rank>)
APPLIED = "weights-applied"


class _BroadcastEnd:
    """What both ends hold: who they are, their group, their payload, how it is cut into pieces
    and the broadcasts in flight on it."""

    def __init__(
        self,
        endpoint: Endpoint,
        group: dist.ProcessGroup,
        store: dist.Store | None,
        bucket_bytes: int = 0,
    ):
        self.endpoint, self.group = endpoint, group
        self.applied = RollCall(store, APPLIED)  # the versions the receivers applied
        self.bucket_bytes = bucket_bytes
        self.payload: Payload | None = None
        self.pieces: list[tuple[int, int]] = []

    def open(self, make_payload: PayloadFactory) -> None:
        self.payload = make_payload()
        self.pieces = self.payload.pieces(self.bucket_bytes)


class BroadcastSink(_BroadcastEnd):
    """Trainer 0's end (a :class:`~harness.sync.contract.Sink`): one series of broadcasts per
    write, streamed from the sender's weights where they are packed as the payload."""

    def __init__(
        self,
        endpoint: Endpoint,
        group: dist.ProcessGroup,
        timeout_s: float,
        store: dist.Store | None,
        bucket_bytes: int = 0,
        pairs: Sequence[dist.ProcessGroup] = (),
        late_s: float = 0.0,
    ):
        super().__init__(endpoint, group, store, bucket_bytes)
        self.timeout_s = timeout_s
        self.late_s = late_s
        self.late = LateWatch(late_s)  # a wait this long names the receivers behind in the log
        # where each piece is broadcast: on a two-rank group per receiver at once (their own
        # threads write to every receiver's socket together), or on the group (Gloo's tree)
        self.lanes = list(pairs) or [group]
        self._works: list[list[dist.Work]] = []  # each piece's broadcasts in flight, one per lane
        # the newest version sent, and the one receivers had to apply to take it
        self.sent = self.needed = -1
        self._stream: _Stream | None = None  # once the first write found the source packed

    def write(self, weights: TensorDictBase, header: Header) -> None:
        self.write_digesting(weights, header, None)

    def write_digesting(
        self, weights: TensorDictBase, header: Header, pending: PendingDigest | None
    ) -> None:
        """:meth:`write`, with the version's digest still to take (``pending``): a sink that
        streams takes it while its first pieces travel, and sends it in the header (last)."""
        self.finish()  # the previous broadcasts still read the buffers
        assert self.payload is not None or self._stream is not None  # open() made one
        self.needed, self.sent = self.sent, header.version
        if self._stream is None and self.bucket_bytes > 0:
            assert self.payload is not None
            self._stream = _Stream.of(weights, self.payload, self.bucket_bytes)
            if self._stream is not None:
                self.payload = None  # the full staging copy is no longer needed: free it now,
                gc.collect()  # not when Python's collector reaches its reference cycles
        if self._stream is not None and self._stream.source is weights:
            if self._stream.direct:
                self._send_direct(self._stream, header, pending)
            else:
                self._send_double_buffered(self._stream, with_digest(header, pending))
            return
        assert self.payload is not None, "a packed source's sink is fed that source only"
        self.payload.write(weights, with_digest(header, pending))
        for start, stop in self.pieces:
            self._broadcast(self.payload.buffer[start:stop])

    def _send_direct(self, stream: _Stream, header: Header, pending: PendingDigest | None) -> None:
        """Every piece but the last straight from the source's bytes, no copy; the digest taken
        while they travel; the last piece, with the header, from the one bucket buffer. Returns
        once the source's own bytes are sent: the trainer may change them after."""
        last = len(self.pieces) - 1
        for k, (start, stop) in enumerate(self.pieces[:last]):
            self._broadcast(stream.piece(k, start, stop))
        stream.header(with_digest(header, pending))
        self._broadcast(stream.piece(last, *self.pieces[last]))
        for works in self._works[:last]:
            for work in works:
                self._wait(work)

    def _send_double_buffered(self, stream: _Stream, header: Header) -> None:
        """A source the transport cannot read (a GPU's): piece k copied into bucket buffer k % 2
        while piece k - 1 travels from the other."""
        stream.header(header)
        for k, (start, stop) in enumerate(self.pieces):
            if k >= 2:  # bucket buffer k % 2 is free once broadcast k - 2 is done
                for work in self._works[k - 2]:
                    self._wait(work)
            self._broadcast(stream.piece(k, start, stop))

    def _broadcast(self, piece: torch.Tensor) -> None:
        rank = self.endpoint.rank
        self._works.append(
            [
                cast(dist.Work, dist.broadcast(piece, src=rank, group=lane, async_op=True))
                for lane in self.lanes
            ]
        )

    def finish(self) -> None:
        works, self._works = self._works, []
        for work in itertools.chain.from_iterable(works):
            self._wait(work)

    def _receivers(self) -> list[int]:
        return [r for r in dist.get_process_group_ranks(self.group) if r != self.endpoint.rank]

    def _name_late(self) -> None:
        late = self.applied.behind(self._receivers(), self.needed)
        who = f"rank{'s' * (len(late) > 1)} {ranks_text(late)}" if late else "a receiver"
        log.warning(
            "%s: weights version %d has waited %.0f s for %s, which had not applied version %d "
            "(stopped or stalled?); waiting up to sync.timeout_s=%g",
            self.endpoint, self.sent, self.late_s, who, self.needed, self.timeout_s,
        )  # fmt: skip

    def _wait(self, work: dist.Work) -> None:
        wait = Wait(self.timeout_s, "sync.timeout_s")
        try:
            with self.late.watching(self._name_late) as watched:
                work.wait(timedelta(seconds=self.timeout_s))
            if watched.named:
                log.warning(
                    "%s: weights version %d reached every receiver after %.1f s",
                    self.endpoint, self.sent, watched.seconds,
                )  # fmt: skip
        except RuntimeError as e:
            self._works = []
            receivers = self._receivers()
            late = self.applied.behind(receivers, self.needed)
            who = (
                f"rank{'s' * (len(late) > 1)} {ranks_text(late)} had not applied version "
                f"{self.needed} (gone or stalled)"
                if late
                else "every one had applied the version before, so one of them died since"
                if late == []
                else "one of them is gone or stalled"
            )
            raise SyncError(
                f"{self.endpoint} could not deliver weights version {self.sent} to ranks "
                f"{ranks_text(receivers)}: {wait.ended(e)}; {who}. Cause: {e}"
            ) from e

    close = finish


class _Stream:
    """A sink's plan for a source packed as the payload, in place of a full staging payload: the
    source's bytes, the header on its own (a few bytes, copied in behind the last piece's
    weights) and bucket buffers. A CPU source is sent straight from its bytes (``direct``), but
    for its last piece, which goes from one bucket buffer with the header; a GPU source is copied
    into two bucket buffers in turn."""

    def __init__(
        self,
        source: TensorDictBase,
        source_bytes: torch.Tensor,
        payload: Payload,
        bucket_bytes: int,
    ):
        self.source, self.source_bytes = source, source_bytes
        self.value_names = payload.value_names
        start, buffer = payload.header_offset, payload.buffer
        self.header_offset = start
        self.header_bytes = buffer[start:].clone()
        base = buffer.data_ptr() + start

        def view(t: torch.Tensor) -> torch.Tensor:
            at = t.data_ptr() - base
            return self.header_bytes[at : at + t.nbytes].view(t.dtype).view(t.shape)

        self.header_td = cast(TensorDictBase, payload.td["header"].apply(view))
        pieces = payload.pieces(bucket_bytes)
        self.direct = source_bytes.device.type == "cpu" and buffer.device.type == "cpu"
        size = pieces[-1][1] - pieces[-1][0] if self.direct else max(b - a for a, b in pieces)
        pin = buffer.is_pinned()
        self.buckets = [
            torch.empty(size, dtype=torch.uint8, device=buffer.device, pin_memory=pin)
            for _ in range(1 if self.direct else 2)
        ]

    @classmethod
    def of(cls, source: TensorDictBase, payload: Payload, bucket_bytes: int) -> _Stream | None:
        flat = flat_region(source, payload.td["weights"])
        return None if flat is None else cls(source, flat[0], payload, bucket_bytes)

    def header(self, header: Header) -> None:
        stamp(self.header_td, header, self.value_names)

    def piece(self, k: int, start: int, stop: int) -> torch.Tensor:
        """What piece ``k``, the payload's bytes ``start:stop``, is sent from: the source's own
        bytes where it is direct and the header is not in it, else a bucket buffer."""
        if self.direct and stop <= self.header_offset:
            return self.source_bytes[start:stop]
        return self.bucket(k, start, stop)

    def bucket(self, k: int, start: int, stop: int) -> torch.Tensor:
        """Bucket buffer ``k`` (of one or two, in turn) holding the payload's bytes
        ``start:stop``: the source's, and the header's where they reach it; copied in full."""
        bucket = self.buckets[k % len(self.buckets)][: stop - start]
        source = self.source_bytes[start:stop]  # the weights' last padding bytes are not there
        bucket[: source.numel()].copy_(source)  # blocking, also from a GPU
        if stop > self.header_offset:
            bucket[self.header_offset - start :].copy_(self.header_bytes)
        return bucket


class BroadcastSource(_BroadcastEnd):
    """A receiver's end (a :class:`~harness.sync.contract.Source`): the
    broadcast lands in its payload, which is its staging buffer. With
    :meth:`digest_on_arrival` it digests each piece as it lands, while the next
    one travels, when it waits for a version (when it polls, every piece is in
    already: it digests them all then, before the apply)."""

    def __init__(
        self,
        endpoint: Endpoint,
        group: dist.ProcessGroup,
        root: int,
        store: dist.Store | None,
        bucket_bytes: int = 0,
    ):
        super().__init__(endpoint, group, store, bucket_bytes)
        self.root = root
        self.version = -1  # the newest version applied
        self._receives: list[dist.Work] = []  # one per piece, in order
        self._verify_on_arrival = False  # sync.verify=every: digest each piece as it lands
        self._plans: dict[int, DigestPlan | None] = {}  # by id of the payload it reads
        self.arrived: tuple[int, int] | None = None  # (version, digest of its bytes as they landed)
        self._spare: Payload | None = None  # lend_live's: the payload the models stopped reading

    def open(self, make_payload: PayloadFactory) -> None:
        super().open(make_payload)
        self._post()

    def digest_on_arrival(self, live_schema: list[str]) -> None:
        """Digest each version's pieces as they land (``sync.verify=every``), where they land
        laid out as the live payload (``live_schema``; not with a wire dtype, whose digest is
        that of the weights cast back)."""
        assert self.payload is not None  # open() made it
        self._verify_on_arrival = self.payload.schema == live_schema

    def lend_live(self, live: Payload) -> None:
        """Apply without copying: point the models at the staging payload the version landed in
        (:meth:`Payload.alias`) and land the next version in the buffer they stopped reading, the
        two taking turns. Only where ``live`` has the staging payload's layout (no wire dtype),
        and for a subscriber that forwards nothing (a forward sends ``live``'s own buffer)."""
        assert self.payload is not None  # open() made it
        if self.payload.schema == live.schema:
            # views of their own over live's buffer: an alias repoints the models' tensors, and
            # live's views may be those very tensors
            self._spare = live.rebase(live.buffer)

    def _plan(self) -> DigestPlan | None:
        """Where the weights lie in the payload the next version lands in (digest on arrival)."""
        assert self.payload is not None  # open() made it
        if not self._verify_on_arrival:
            return None
        key = id(self.payload)
        if key not in self._plans:
            self._plans[key] = DigestPlan.of(self.payload.weight_views, self.payload.buffer)
        return self._plans[key]

    def _post(self) -> None:
        assert self.payload is not None  # open() made it
        buffer = self.payload.buffer
        self._receives = [
            cast(
                dist.Work,
                dist.broadcast(buffer[a:b], src=self.root, group=self.group, async_op=True),
            )
            for a, b in self.pieces
        ]
        self._landed, self._sum = 0, 0  # pieces digested as they landed, and their parts' sum
        self.applied.mark(self.endpoint.rank, self.version)  # ready for the one after it

    @property
    def exhausted(self) -> bool:
        """The publisher sent its stop; nothing more will come."""
        return not self._receives

    def _apply(self, live: Payload) -> Header:
        assert self.payload is not None  # open() made it
        header = self.payload.header()
        whole = self._plan() is not None and self._landed == len(self.pieces)
        self.arrived = (header.version, wrap(self._sum)) if whole else None
        if self._spare is None:
            live.copy_from(self.payload)
        else:  # the models read the staging payload now; the next version lands in the other
            live.alias(self.payload)
            self.payload, self._spare = self._spare, self.payload
        self.version = header.version
        if header.stop:
            self._receives = []
        else:
            self._post()
        return header

    def poll_into(self, live: Payload) -> Header | None:
        if not self._receives or not all(w.is_completed() for w in self._receives):
            return None
        return self.wait_into(live, timeout_s=1.0)

    def wait_into(self, live: Payload, timeout_s: float) -> Header:
        assert self._receives  # callers check exhausted (no receive posted) first
        assert self.payload is not None  # open() made it
        wait, plan = Wait(timeout_s), self._plan()
        try:
            for k, work in enumerate(self._receives):  # the pieces land in order; the header last
                work.wait(timedelta(seconds=max(wait.remaining, 0.001)))
                if plan is not None and k == self._landed:  # while piece k + 1 travels
                    self._sum += plan.part(self.payload.buffer, *self.pieces[k])
                    self._landed += 1
        except RuntimeError as e:
            self._receives = []
            raise SyncError(
                f"the broadcast from rank {self.root} ended {wait.seconds:.1f} s in: {e}"
            ) from e
        return self._apply(live)

    def close(self) -> None:
        self._receives = []


def with_digest(header: Header, pending: PendingDigest | None) -> Header:
    """``header`` carrying the version's digest, when it has one to carry."""
    return header if pending is None else replace(header, digest=pending.value)
