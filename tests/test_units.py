"""Unit tests: GAE by hand, packed payloads, the weight sync contract, the in-process scheme,
metrics CSV."""

from __future__ import annotations

import csv

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from harness.algos.gae import gae
from harness.core.packing import buffer_of, first_difference, pack, pack_parameters_, schema
from harness.distributed import handshake
from harness.metrics.logger import CSVLog
from harness.sync import SchemaMismatchError
from harness.sync.broadcast import BroadcastSink, BroadcastSource
from harness.sync.contract import Endpoint, Sink, Source
from harness.sync.local import local_pair
from harness.sync.payload import Header, Payload, weights_of
from harness.sync.shared_memory import ShmSink, ShmSource


@pytest.mark.unit
def test_gae_matches_a_hand_computed_case():
    # One env, three steps, the episode ends at step 1; gamma 0.5, lambda 0.5.
    reward = torch.tensor([[1.0], [2.0], [3.0]])
    value = torch.tensor([[0.5], [1.0], [2.0]])
    done = torch.tensor([[False], [True], [False]])
    next_value = torch.tensor([4.0])
    adv = gae(reward, value, done, next_value, gamma=0.5, lam=0.5)
    d2 = 3 + 0.5 * 4 - 2  # 3.0, bootstraps from next_value
    d1 = 2 - 1.0  # 1.0, terminal: no bootstrap, no carry
    d0 = 1 + 0.5 * 1.0 - 0.5  # 1.0
    a0 = d0 + 0.25 * d1
    assert torch.allclose(adv.squeeze(1), torch.tensor([a0, d1, d2]))


@pytest.mark.unit
def test_schema_is_sorted_and_names_the_first_difference():
    a = schema(TensorDict(b=torch.zeros(2), a=torch.zeros(3, dtype=torch.int64)))
    assert a == ["a (3,) int64", "b (2,) float32"]
    b = schema(TensorDict(b=torch.zeros(5), a=torch.zeros(3, dtype=torch.int64)))
    assert first_difference(a, b) == "here 'b (2,) float32', there 'b (5,) float32'"
    assert "exists only here" in first_difference(a, a[:1])


@pytest.mark.unit
def test_pack_puts_every_leaf_in_one_buffer():
    packed = pack(
        TensorDict(x=torch.ones(3), y=TensorDict(z=torch.full((2,), 7, dtype=torch.int64)))
    )
    buf = buffer_of(packed)
    assert (
        buf.dtype == torch.uint8 and 3 * 4 + 2 * 8 <= buf.numel() <= 3 * 4 + 2 * 8 + 8
    )  # + alignment
    buf.zero_()
    assert packed["x"].sum() == 0 and packed["y", "z"].sum() == 0


@pytest.mark.unit
def test_buffer_of_is_the_one_storage_every_leaf_views_and_nothing_else():
    packed = pack(TensorDict(a=torch.ones(3), b=torch.zeros(0), c=torch.ones((), dtype=torch.bool)))
    buf = buffer_of(packed)
    assert (
        buf.data_ptr() == packed["a"].untyped_storage().data_ptr() and buf.numel() == 16 + 8
    )  # each leaf padded to 8 bytes
    with pytest.raises(TypeError, match="pack"):
        buffer_of(TensorDict(a=torch.ones(3)))


@pytest.mark.unit
def test_rebased_payload_writes_straight_into_its_buffer_and_alias_points_models_at_it():
    trainer, collector = nn.Linear(3, 2), nn.Linear(3, 2)
    pack_parameters_(trainer)  # packed like the payload: the write is one flat copy
    template = Payload.from_models({"policy": trainer})
    slot = Payload.from_models({"policy": trainer}).rebase(
        torch.zeros(template.buffer.numel(), dtype=torch.uint8)
    )
    slot.write(weights_of({"policy": trainer}), Header(4))
    assert slot.header().version == 4 and template.header().version == 0
    live = Payload.from_models({"policy": collector})
    live.bind({"policy": collector})
    live.alias(slot)
    assert (
        torch.equal(collector.weight, trainer.weight)
        and collector.weight.data_ptr() == slot.td["weights", "policy", "weight"].data_ptr()
    )


@pytest.mark.unit
def test_schema_errors_live_with_the_handshake_and_transports_fit_the_contract():
    assert SchemaMismatchError is handshake.SchemaMismatchError
    end = Endpoint(0, "trainer", "gloo")
    assert all(isinstance(s, Sink) for s in (BroadcastSink(end, None, 1.0, None), ShmSink(0, 1)))
    assert all(
        isinstance(s, Source) for s in (BroadcastSource(end, None, 0, None), ShmSource(0.001))
    )


@pytest.mark.unit
def test_bound_models_view_the_live_buffer_so_apply_is_one_copy():
    model = nn.Linear(3, 2)
    payload = Payload.from_models({"policy": model})
    payload.bind({"policy": model})
    payload.buffer.fill_(0)
    assert model.weight.abs().sum() == 0 and model.bias.abs().sum() == 0
    start, end = payload.buffer.data_ptr(), payload.buffer.data_ptr() + payload.buffer.numel()
    assert all(start <= p.data_ptr() < end for p in model.parameters())


@pytest.mark.unit
def test_header_values_must_match_what_connect_declared():
    payload = Payload.from_models({"policy": nn.Linear(2, 2)}, ("epsilon",))
    with pytest.raises(ValueError, match="epsilon"):
        payload.write_header(Header(1, values={}))


@pytest.mark.unit
def test_in_process_scheme_delivers_the_newest_version():
    trainer, collector = nn.Linear(4, 2), nn.Linear(4, 2)
    publisher, subscriber = local_pair(timeout_s=1)
    publisher.connect({"policy": trainer})
    subscriber.connect({"policy": collector})
    for version in range(3):
        with torch.no_grad():
            trainer.weight.fill_(version)
        publisher.publish(Header(version, frames=10 * version))
    header = subscriber.wait(2)
    assert (header.version, header.frames) == (2, 20)
    assert torch.equal(collector.weight, trainer.weight)
    assert subscriber.poll() is None  # nothing newer
    with pytest.raises(RuntimeError, match="version >= 3"):
        subscriber.wait(3)


@pytest.mark.unit
def test_csv_log_widens_its_header_when_a_metric_appears(tmp_path):
    log = CSVLog(tmp_path / "metrics.csv")
    log.write({"frames": 1, "a": 1.0})
    log.write({"frames": 2, "a": 2.0, "b": 3.0})
    log.write({"frames": 3, "a": 4.0})
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert (
        [r["frames"] for r in rows] == ["1", "2", "3"]
        and rows[1]["b"] == "3.0"
        and rows[0]["b"] == ""
    )


@pytest.mark.unit
def test_rank_lists_read_as_ranges():
    from harness.distributed.roll_call import RollCall, ranks_text

    assert (
        ranks_text([8, 1, 2, 3, 5, 7]) == "1-3, 5, 7-8"
        and ranks_text([4]) == "4"
        and ranks_text([]) == ""
    )
    assert RollCall(None, "joined").behind([1, 2]) is None  # no store: nobody can be named


@pytest.mark.unit
def test_a_process_starts_without_torch_dynamo_and_tensordicts_compile_marks_still_apply():
    """harness.core.quick_import: tensordict is imported without ``torch._dynamo``; its
    ``allow_in_graph`` marks land in dynamo's table when compiling starts, as torch's own would."""
    import subprocess
    import sys

    probe = (
        "import sys, harness.train\n"
        "assert 'torch._dynamo' not in sys.modules, 'dynamo loaded at import'\n"
        "from tensordict.base import _foreach_copy_compiled as fn\n"
        "from tensordict.utils import _lock_warn\n"
        "assert _lock_warn._dynamo_marked_constant\n"
        "from harness.core import quick_import\n"
        "quick_import.mark_for_compile()\n"
        "from torch._dynamo import trace_rules\n"
        "assert id(fn) in trace_rules._allowed_callable_ids, 'allow_in_graph not applied'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
