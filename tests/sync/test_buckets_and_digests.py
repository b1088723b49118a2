"""Weights streamed in buckets and checked against a digest, on real spawned gloo ranks: a
collector never acts on a mix of two versions, and a byte corrupted on the way is a named error."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from test_sync_schemes import ONE_NODE, TWO_NODES, check_versions, connect, publish_versions

from harness.sync import Header, SyncError
from harness.sync.broadcast import _Stream
from harness.sync.config import SyncConfig
from harness.sync.digest import CHUNK_WORDS, DigestPlan, digest, verified, wrap
from harness.sync.payload import Payload
from harness.testing.spawn import run_ranks

# make_models' weights are about 1.8 kB: buckets of 256 bytes cut a version into 8 broadcasts
BUCKETS = {"bucket_mb": 256 / 2**20, "packed": True, "verify": "every"}


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "scheme, nodes", [("gloo", ONE_NODE), ("hierarchical", TWO_NODES)], ids=["gloo", "hier-2node"]
)
def test_stress_no_torn_update_while_streaming_buckets_and_every_version_verified(scheme, nodes):
    results = run_ranks(
        publish_versions, len(nodes), scheme, 300, 2, "float32", BUCKETS, nodes=nodes, timeout=120
    )
    check_versions(results, len(nodes), 299)
    streamed, lanes = results[0][1]
    assert streamed == 1, "trainer 0's broadcast sink streamed the packed weights"
    # gloo's 2 collectors: a two-rank group each, at once; the leaders' group: one broadcast
    assert lanes == ([2] if scheme == "gloo" else [0, 1]), lanes


def flip_a_byte(buffer: torch.Tensor) -> None:
    buffer[len(buffer) // 3].bitwise_xor_(torch.tensor(0x10, dtype=torch.uint8))


def corrupting_publisher(rank, world, scheme, streamed):
    """Trainer 0 flips one byte of what it sends after the digest is taken: in the first piece it
    streams (sent from a copy: the trainer's own weights stay as they are), or in the payload it
    stages (a shared-memory slot for shm, the store's value for the plugin ``toy_store``)."""
    if scheme == "toy_store":
        import toy_scheme  # noqa: F401  (a plugin, as HARNESS_PLUGINS imports it: adds the scheme)
    sync = {"verify": "every"} | (BUCKETS if streamed else {})
    if rank == 0:
        if streamed:
            original = _Stream.piece

            def piece(self, k, start, stop):
                out = original(self, k, start, stop)
                if k == 0:
                    out = out.clone()
                    flip_a_byte(out)
                return out

            _Stream.piece = piece  # type: ignore[method-assign]
        else:
            write = Payload.write

            def corrupt_write(self, weights, header):
                write(self, weights, header)
                flip_a_byte(self.buffer[: self.header_offset])

            Payload.write = corrupt_write  # type: ignore[method-assign]
    end, _ = connect(rank, scheme, sync=sync)
    outcome = None
    if rank == 0:
        end.publish(Header(0, stop=True, values={"epsilon": 0.0}))
    else:
        try:
            end.wait(0, timeout_s=8)
            outcome = "applied", ""
        except SyncError as e:
            outcome = type(e).__name__, str(e)
    dist.barrier()  # trainer 0 keeps its segment until every reader is done with it
    end.close()
    return outcome


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "scheme, nodes, streamed",
    [
        ("gloo", ONE_NODE, False),
        ("gloo", ONE_NODE, True),
        ("shm", ONE_NODE, False),
        ("hierarchical", TWO_NODES, True),
        ("toy_store", ONE_NODE, False),  # a plugin's scheme checks digests without asking
    ],
    ids=["gloo-staged", "gloo-streamed", "shm", "hier-2node-streamed", "plugin"],
)
def test_a_byte_corrupted_on_the_way_is_caught_and_named(scheme, nodes, streamed):
    results = run_ranks(corrupting_publisher, len(nodes), scheme, streamed, nodes=nodes)
    assert results[0][0] == "ok", results[0]
    # On two nodes only the broadcast to node 1 streams: its leader, rank 3, catches the byte.
    catchers = [3] if len(nodes) > 3 else [1, 2]
    for rank in catchers:
        assert results[rank][0] == "ok", results[rank]
        name, message = results[rank][1]
        assert name == "CorruptWeightsError", results[rank]
        assert f"rank {rank} (collector, sync={scheme})" in message
        assert "version 0" in message and "arrived corrupt" in message


@pytest.mark.unit
def test_the_digest_changes_with_any_single_byte_and_with_chunks_swapped():
    gen = torch.Generator().manual_seed(0)
    # three whole 1 MiB chunks and a part; then 28 bytes: three words and a 4-byte tail
    leaves = [
        torch.randn(3 * CHUNK_WORDS + 5, generator=gen, dtype=torch.float64),
        torch.randn(7, generator=gen),
    ]
    reference = digest(leaves)
    assert digest([t.clone() for t in leaves]) == reference
    big, small = (t.view(torch.uint8) for t in leaves)
    for raw, at in [(big, 0), (big, 7), (big, 8 * CHUNK_WORDS - 1), (small, 27)]:
        for bit in (0x01, 0x80):  # a word's lowest and highest bits, and the tail's
            raw[at] ^= bit
            assert digest(leaves) != reference, (at, bit)
            raw[at] ^= bit
    assert digest(leaves) == reference
    chunk = 8 * CHUNK_WORDS
    first, second = big[:chunk].clone(), big[chunk : 2 * chunk].clone()
    big[:chunk], big[chunk : 2 * chunk] = second, first  # the same words, two chunks swapped
    assert digest(leaves) != reference


@pytest.mark.unit
def test_tensors_within_a_chunk_digest_as_the_definition_written_out():
    """Each is one chunk: its 64-bit words (signed, little-endian) and tail bytes summed, weighted
    by 2 x its position + 1, all wrapping at 64 bits."""
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(n, generator=gen) for n in (1, 2, 3, 5, 8, 13, 1000)]
    expected = 0
    for position, t in enumerate(tensors):
        raw = t.numpy().tobytes()
        whole = len(raw) // 8 * 8
        words = sum(
            int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, whole, 8)
        )
        expected += (2 * position + 1) * (words + sum(raw[whole:]))
    assert digest(tensors) == (expected + 2**63) % 2**64 - 2**63


@pytest.mark.unit
def test_the_digest_taken_range_by_range_is_the_digest():
    """A sender digests a piece while the next travels, a receiver each piece as it lands: the
    parts of any ranges cut at multiples of 8 bytes add up to the digest of the whole."""
    gen = torch.Generator().manual_seed(2)
    models = {
        "policy": torch.nn.Sequential(torch.nn.Linear(300, 1000), torch.nn.Linear(1000, 3)),
        "obs_norm": torch.nn.Linear(3, 1, dtype=torch.float64),
    }
    models["policy"][0].weight.data = torch.randn(3 * CHUNK_WORDS + 11, generator=gen)  # chunked
    payload = Payload.from_models(models)
    plan = DigestPlan.of(payload.weight_views, payload.buffer)
    assert plan is not None
    reference, end = digest(payload.weight_views), payload.header_offset
    for step in (8, 256, 8 * 1000, 8 * CHUNK_WORDS - 8, end):
        cuts = [*range(0, end, step), end]
        parts = [plan.part(payload.buffer, a, b) for a, b in itertools.pairwise(cuts)]
        assert wrap(sum(parts)) == reference, step


@pytest.mark.unit
def test_sample_verifies_every_eighth_version_and_off_none():
    assert [v for v in range(20) if verified("sample", v)] == [0, 8, 16]
    assert all(verified("every", v) for v in range(5))
    assert not any(verified("off", v) for v in range(5))


@pytest.mark.unit
def test_pieces_cut_the_weights_into_buckets_and_end_with_the_header():
    models = {"policy": torch.nn.Linear(100, 10)}  # 4,040 bytes of weights
    payload = Payload.from_models(models, ["epsilon"])
    pieces = payload.pieces(1024)
    assert pieces[0][0] == 0 and pieces[-1][1] == payload.buffer.numel()
    assert all(a == b for (_, a), (b, _) in itertools.pairwise(pieces)), "contiguous"
    assert [b - a for a, b in pieces[:-1]] == [1024] * 3
    assert pieces[-1][0] < payload.header_offset < pieces[-1][1]
    assert payload.pieces(0) == [(0, payload.buffer.numel())]


@pytest.mark.unit
@pytest.mark.parametrize(
    "field, value, says",
    [("bucket_mb", -1, "sync.bucket_mb must be >= 0"), ("verify", "always", "sync.verify")],
)
def test_bad_bucket_and_verify_settings_are_refused_naming_the_choices(field, value, says):
    with pytest.raises(ValueError, match=says):
        SyncConfig(**{field: value})
