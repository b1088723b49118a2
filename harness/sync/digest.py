"""A cheap digest of a version's weights, so that a collector can prove what its policy holds.

The publisher computes it once per version over the tensors it sends; a collector recomputes it
over the tensors its models read after applying the version (``sync.verify``), and a difference
is a :class:`~harness.sync.contract.CorruptWeightsError`, not a bad episode.

The digest reads every byte once and does no arithmetic beyond integer additions, so it runs at
memory speed (about 15 ms for 400 MB on one core of the 2-core CPU machine the benchmarks run
on). It is a sum of 64-bit words, wrapping, taken per chunk of 1 MiB (a chunk never spans two
tensors) and weighted by the chunk's odd position number: multiplying by an odd number is a
bijection modulo 2**64, so any change to a single word always changes the digest, and a chunk
that lands in another chunk's place (a bucket written at the wrong offset) changes it too. It is
not a cryptographic hash: it detects corruption and mix-ups, not an adversary.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

import torch

CHUNK_WORDS = 1 << 17  # 1 MiB of 64-bit words
VERIFY = ("off", "sample", "every")  # sync.verify
SAMPLE_EVERY = 8  # sync.verify=sample checks versions 0, 8, 16, ...


def verified(mode: str, version: int) -> bool:
    """Whether version ``version`` is digested (by the publisher) and checked (by collectors)."""
    return mode == "every" or (mode == "sample" and version % SAMPLE_EVERY == 0)


def _words(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t``'s bytes as 64-bit words, and its last ``nbytes % 8`` bytes (as int64 values)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.data_ptr() % 8:  # a view at an odd offset: an aligned copy (never a packed payload)
        raw = raw.clone()
    whole = raw.numel() // 8 * 8
    return raw[:whole].view(torch.int64), raw[whole:].to(torch.int64)


def digest(tensors: Iterable[torch.Tensor]) -> int:
    """The digest of ``tensors``' bytes, in order (see the module docstring). Tensors smaller than
    a chunk, a chunk each, are summed together in two scatter-adds: a model of many small
    tensors costs a few operations, not a few per tensor."""
    total: torch.Tensor | None = None
    chunks = 0  # chunks digested so far, for the next chunk's position weight
    # tensors within one chunk: their words, tail bytes and positions
    words_of: list[torch.Tensor] = []
    tails_of: list[torch.Tensor] = []
    positions: list[int] = []
    for t in tensors:
        words, tail = _words(t)
        full = words.numel() // CHUNK_WORDS
        if full == 0:
            words_of.append(words)
            tails_of.append(tail)
            positions.append(chunks)
            chunks += 1
            continue
        sums = torch.cat(
            [
                words[: full * CHUNK_WORDS].view(full, CHUNK_WORDS).sum(dim=1),
                (words[full * CHUNK_WORDS :].sum() + tail.sum()).reshape(1),
            ]
        )
        weights = torch.arange(chunks, chunks + full + 1, device=sums.device) * 2 + 1
        part = (sums * weights).sum()
        total = part if total is None else total + part
        chunks += full + 1
    if positions:
        part = _small_part(words_of, tails_of, positions)
        total = part if total is None else total + part
    return 0 if total is None else int(total)


def _small_part(
    words_of: list[torch.Tensor], tails_of: list[torch.Tensor], positions: list[int]
) -> torch.Tensor:
    """The weighted sum of tensors that fit a chunk each: every one's words and tail bytes added
    into its own slot, then weighted by its position."""
    device = words_of[0].device
    sums = torch.zeros(len(positions), dtype=torch.int64, device=device)
    slots = torch.arange(len(positions), device=device)
    for pieces in (words_of, tails_of):
        counts = torch.tensor([p.numel() for p in pieces], device=device)
        sums.index_add_(0, slots.repeat_interleave(counts), torch.cat(pieces))
    weights = torch.tensor(positions, device=device) * 2 + 1
    return (sums * weights).sum()


def wrap(value: int) -> int:
    """``value`` as a signed 64-bit word, as :func:`digest` returns it (its sums wrap)."""
    return (value + 2**63) % 2**64 - 2**63


class DigestPlan:
    """:func:`digest` of tensors that view one buffer, taken range by range: the digest is a
    weighted sum, so the parts of any ranges that cover the weights add up to it (wrapped, see
    :func:`wrap`). A sender digests a range while the next one travels, a receiver while it copies
    it (the bytes read once, while in cache). Every tensor must start 8 bytes into the buffer
    (packed payloads do: :func:`harness.core.packing.buffer_of`), so a range cut at a multiple of
    8 cuts between words."""

    def __init__(self, spans: list[tuple[int, int, int]]):
        self.spans = sorted(spans)  # (offset in the buffer, bytes, the first chunk's position)
        self.starts = [offset for offset, _, _ in self.spans]

    @classmethod
    def of(cls, tensors: Iterable[torch.Tensor], buffer: torch.Tensor) -> DigestPlan | None:
        """The plan of ``tensors`` (in digest order) in ``buffer``; None where one is not a
        contiguous, 8-byte aligned view of it."""
        base, end, spans, position = buffer.data_ptr(), buffer.numel(), [], 0
        for t in tensors:
            offset = t.data_ptr() - base
            if not t.is_contiguous() or offset % 8 or offset < 0 or offset + t.nbytes > end:
                return None
            spans.append((offset, t.nbytes, position))
            position += t.nbytes // 8 // CHUNK_WORDS + 1  # as digest() counts its chunks
        return cls(spans)

    def part(self, buffer: torch.Tensor, start: int, stop: int) -> int:
        """The digest's part from bytes ``start:stop`` of ``buffer`` (laid out as planned);
        ``start`` and ``stop`` multiples of 8, or ``stop`` the buffer's end."""
        total = 0
        # tensors of one chunk each: their words, tail bytes and positions, summed together
        small_words: list[torch.Tensor] = []
        small_tails: list[torch.Tensor] = []
        small_positions: list[int] = []
        for i in range(max(bisect.bisect_right(self.starts, start) - 1, 0), len(self.spans)):
            offset, nbytes, position = self.spans[i]
            if offset >= stop:
                break
            a, b = max(start - offset, 0), min(stop - offset, nbytes)
            if a >= b:
                continue
            whole = nbytes // 8 * 8
            raw = buffer[offset + a : offset + b]
            words = raw[: max(min(b, whole) - a, 0)].view(torch.int64)
            tail = raw[max(whole - a, 0) :].to(torch.int64)
            if whole // 8 < CHUNK_WORDS:  # one chunk: summed with the others like it
                small_words.append(words)
                small_tails.append(tail)
                small_positions.append(position)
                continue
            total += _chunked_part(words, a // 8, tail, whole // 8, position)
        if small_positions:
            total += int(_small_part(small_words, small_tails, small_positions))
        return total


def _chunked_part(
    words: torch.Tensor, first: int, tail: torch.Tensor, count: int, position: int
) -> int:
    """A large tensor's part: its words ``first:first + len(words)`` of ``count`` summed per chunk
    and weighted by the chunk's position, and its tail bytes (in its last chunk)."""
    head = min(-first % CHUNK_WORDS, words.numel())
    rest = words[head:]
    full = rest.numel() // CHUNK_WORDS
    sums = [words[:head].sum().reshape(1)] if head else []
    sums += [rest[: full * CHUNK_WORDS].view(full, CHUNK_WORDS).sum(dim=1)] if full else []
    sums += [rest[full * CHUNK_WORDS :].sum().reshape(1)] if rest.numel() % CHUNK_WORDS else []
    total = 0
    if sums:
        chunk = first // CHUNK_WORDS
        weights = torch.arange(chunk, chunk + sum(s.numel() for s in sums)) * 2 + 1 + 2 * position
        total += int((torch.cat(sums) * weights).sum())
    if tail.numel():
        total += int(tail.sum() * (2 * (position + count // CHUNK_WORDS) + 1))
    return total


class PendingDigest:
    """A version's digest, taken at most once: by the first sink that needs it (a sink that streams
    takes it while its first pieces travel), or handed over by a sink that took it on the way (an
    shm writer, folded into its copy)."""

    def __init__(self, compute: Callable[[], int]):
        self._compute = compute
        self._value: int | None = None

    @property
    def value(self) -> int:
        if self._value is None:
            self._value = self._compute()
        return self._value

    def provide(self, value: int) -> None:
        self._value = value


def copy_digesting(target: torch.Tensor, source: torch.Tensor, plan: DigestPlan, block: int) -> int:
    """Copy ``source`` into ``target`` (uint8 buffers of one size) ``block`` bytes at a time and
    return the digest of what ``target`` holds, each block digested right after its copy, while
    it is still in the cache: the bytes come from memory once, not twice."""
    total = 0
    for start in range(0, target.numel(), block):
        stop = min(start + block, target.numel())
        target[start:stop].copy_(source[start:stop])
        total += plan.part(target, start, stop)
    return wrap(total)
