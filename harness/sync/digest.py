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

from collections.abc import Iterable

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
