"""The gloo weight sync scheme on real spawned gloo ranks: the contract's guarantees."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
import torch
from torch import nn

from conftest import run_ranks
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.sync import Endpoint, Header, SchemaMismatchError, SyncError
from harness.sync.gloo import GlooPublisher, GlooSubscriber
from harness.sync.none import NonePublisher, NoneSubscriber


def make_models(hidden: int = 32) -> dict[str, nn.Module]:
    policy = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 4))
    norm = nn.Module()
    norm.register_buffer("mean", torch.zeros(8, dtype=torch.float64))  # a second model, another dtype
    return {"policy": policy, "obs_norm": norm}


def fill(models, version: int) -> None:
    """Deterministic weights for ``version``: any rank can recompute them."""
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for m in models.values():
            for t in [*m.parameters(), *m.buffers()]:
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))


def digest(models) -> str:
    h = hashlib.sha1()
    for m in models.values():
        for t in [*m.parameters(), *m.buffers()]:
            h.update(t.detach().numpy().tobytes())
    return h.hexdigest()


def expected_digest(version: int, hidden: int = 32) -> str:
    models = make_models(hidden)
    fill(models, version)
    return digest(models)


def endpoint(rank):
    return Endpoint(rank, "trainer" if rank == 0 else "collector", "gloo")


def connect(rank, hidden=32, timeout_s=10.0, scheme=(GlooPublisher, GlooSubscriber)):
    groups = init_distributed(Layout.from_env(1), timeout_s=20)
    models = make_models(hidden)
    cls = scheme[0] if rank == 0 else scheme[1]
    end = cls(endpoint(rank), timeout_s, groups.sync)
    end.connect(models, ("epsilon",))
    return end, models


def publish_versions(rank, world, versions, env_steps_between_polls):
    """Trainer publishes ``versions`` updates back to back; collectors poll
    between simulated env steps and check every applied update bit for bit."""
    end, models = connect(rank)
    if rank == 0:
        for v in range(versions):
            fill(models, v)
            end.publish(Header(v, frames=100 * v, stop=v == versions - 1, values={"epsilon": v / 1000}))
        end.close()
        return None
    seen, torn = [], 0
    header = end.wait(0)
    while True:
        if digest(models) != expected_digest(header.version):
            torn += 1
        seen.append((header.version, header.frames, header.values["epsilon"]))
        if header.stop:
            return seen, torn
        for _ in range(env_steps_between_polls):
            sum(p.sum() for p in models["policy"].parameters())  # "acting" with the live weights
        header = end.poll() or (end.wait(end.version + 1) if env_steps_between_polls == 0 else end.header)


def test_weights_bit_exact_and_versions_monotonic():
    results = run_ranks(publish_versions, 3, 20, 0)
    for rank in (1, 2):
        status, value = results[rank]
        assert status == "ok", value
        seen, torn = value
        versions = [v for v, _, _ in seen]
        assert versions == sorted(set(versions)) and versions[0] == 0 and versions[-1] == 19
        assert all(frames == 100 * v and eps == v / 1000 for v, frames, eps in seen)
        assert torn == 0
    assert results[0][0] == "ok", results[0][1]


def test_stress_no_torn_update_while_publishing_continuously():
    results = run_ranks(publish_versions, 3, 300, 3, timeout=120)
    for rank in (1, 2):
        status, value = results[rank]
        assert status == "ok", value
        seen, torn = value
        versions = [v for v, _, _ in seen]
        assert torn == 0, f"rank {rank} acted with {torn} torn updates"
        assert versions == sorted(versions) and versions[-1] == 299


def mismatched(rank, world):
    connect(rank, hidden=16 if rank == 2 else 32)


def test_schema_mismatch_fails_every_rank_naming_the_key():
    results = run_ranks(mismatched, 3)
    assert {s for s, _ in results.values()} == {"SchemaMismatchError"}, results
    assert "policy.0.bias" in results[2][1] and "(16,)" in results[2][1]
    assert "ranks [2]" in results[0][1]


def silent_publisher(rank, world, timeout_s):
    end, _ = connect(rank, timeout_s=30)
    if rank == 0:
        time.sleep(timeout_s + 3)  # connected, never publishes
        return None
    start = time.monotonic()
    try:
        end.wait(0, timeout_s=timeout_s)
    except SyncError as e:
        return str(e), time.monotonic() - start
    return "no error", 0.0


def test_wait_times_out_naming_rank_role_and_scheme():
    results = run_ranks(silent_publisher, 2, 2.0)
    message, elapsed = results[1][1]
    assert "rank 1 (collector, sync=gloo)" in message and "version >= 0" in message
    assert 1.5 < elapsed < 6


def dying_publisher(rank, world):
    end, _ = connect(rank, timeout_s=30)
    if rank == 0:
        os._exit(1)  # gone without a word, like a SIGKILL
    start = time.monotonic()
    try:
        end.wait(0, timeout_s=20)
    except SyncError as e:
        return str(e), time.monotonic() - start
    return "no error", 0.0


def test_dead_publisher_is_an_error_not_a_hang():
    results = run_ranks(dying_publisher, 2)
    message, elapsed = results[1][1]
    assert "rank 1 (collector, sync=gloo)" in message
    assert elapsed < 25


def header_only(rank, world):
    end, models = connect(rank, scheme=(NonePublisher, NoneSubscriber))
    if rank == 0:
        fill(models, 5)
        end.publish(Header(5, stop=True, values={"epsilon": 0.5}))
        end.close()
        return None
    before = digest(models)
    header = end.wait(5)
    return header.version, header.stop, header.values["epsilon"], digest(models) == before


def test_none_scheme_moves_the_header_but_not_the_weights():
    results = run_ranks(header_only, 2)
    assert results[1] == ("ok", (5, True, 0.5, True)), results
