"""The model, the memory probes and the floors of ``benchmarks/weight_sync.py``.

Floors and references, each moving the same bytes as the schemes, timed like them (rank 0
stamps the clock, every receiver notes when the bytes are in its hands):

- ``memcpy``: one in-process, cache-hot copy (the floor of ``shm``, which is one copy);
- ``tcp``: raw loopback TCP, the floor of ``gloo``: rank 0 holds a socket to each receiver over
  127.0.0.1 (default buffer sizes, which the kernel tunes: larger fixed ones were slower here)
  and ``sendall``s the bytes to all of them at once (one thread each when there are several); a
  receiver ``recv_into``s them into a buffer of its own. No framing, no protocol, no copy at the
  sender;
- ``shm_copy_ack``: the cross-process floor of shared memory, a copy plus a futex wake-up;
- ``gloo_per_param``: one Gloo broadcast per tensor, the naive way.

Rank functions return ``{"ms": [latency of each version], "maxrss_mb": peak RSS}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import re
import resource
import socket
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from harness.core.packing import pack_parameters_
from harness.distributed.setup import init_distributed
from harness.distributed.topology import Layout
from harness.sync import futex, shm_files

LAYERS = 50
PROCESS_GROUP_TIMEOUT_S = 600  # a publish of 1B parameters over loopback takes seconds
MB = 2**20


def make_model(params: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    """About ``params`` parameters as 100 tensors (50 linear layers). The weights are filled with
    a constant per layer, not drawn at random: transports do not look at values, and a random
    initialisation of 1B bfloat16 parameters costs about 25 s of CPU a process here."""
    width = max(int(math.sqrt(params / LAYERS)), 1)
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(width, width, dtype=dtype) for _ in range(LAYERS)])
    model.to_empty(device="cpu")
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(1.0 / (i + 1))  # every page touched, as an initialised model's are
    return model


def model_bytes(params: int, dtype: torch.dtype = torch.float32) -> int:
    width = max(int(math.sqrt(params / LAYERS)), 1)
    return LAYERS * (width * width + width) * torch.empty(0, dtype=dtype).element_size()


def status_mb(key: str) -> float:
    """A ``/proc/self/status`` memory line (VmRSS, VmHWM, RssShmem...), MiB."""
    with open("/proc/self/status") as f:
        found = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(found.group(1)) / 1024 if found else float("nan")


def first_for_the_oom_killer() -> None:
    """On a shared machine, a launch that runs out of memory should lose its own ranks, not
    another user's processes: the OOM killer picks the highest ``oom_score_adj`` first."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def maxrss_mb() -> float:
    """This process's peak RSS so far (getrusage; Linux counts KiB), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_clock() -> tuple[float, int, int]:
    """This process's CPU time so far, all threads, user and system, ms; and its voluntary and
    involuntary context switches. Unlike latency, a publish's CPU time hardly moves with the
    machine's load: it is what a comparison of two builds on a shared machine can trust."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return 1000 * (usage.ru_utime + usage.ru_stime), usage.ru_nvcsw, usage.ru_nivcsw


def release_start_up_memory() -> tuple[float, float]:
    """Free what start-up left behind and say how much, MiB: ``(garbage, retained)``. Garbage:
    objects in reference cycles (TensorDict's consolidated payloads are in some), which only
    Python's cyclic collector frees, when it chooses to run; retained: memory freed into glibc's
    heap but kept from the kernel until ``malloc_trim``."""
    before = status_mb("VmRSS")
    gc.collect()
    collected = status_mb("VmRSS")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return before - collected, collected - status_mb("VmRSS")


def reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS: writing ``5`` to
    ``/proc/self/clear_refs`` (Linux 4.0+). It resets ``ru_maxrss`` too, so read that first.
    False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def copies_needed(scheme: str, collectors: int) -> int:
    """Full copies of the model a launch may hold at once, at its peak (start-up), as measured at
    100M and 500M parameters (peak RSS less the interpreter's and the segment's pages): the
    trainer 3.8 with gloo, 2.9 with shm (its model, packing's and ``connect``'s payloads, some
    not yet collected), a collector 2.9 (its model, its payloads, a staging copy), and shm's
    segment of collectors + 2 slots."""
    if scheme in ("memcpy", "d2h"):
        return 2
    if scheme in ("tcp", "gloo_per_param"):
        return 1 + collectors
    if scheme == "shm_copy_ack":
        return 5
    if scheme in ("shm", "hierarchical"):  # the trainer's copies less the segment's pages
        return 3 + 3 * collectors + collectors + 2
    return 4 + 3 * collectors


def fits(scheme: str, collectors: int, nbytes: int) -> tuple[bool, str]:
    """Whether a launch's estimated peak leaves 1 GiB of the memory available now (the machine is
    shared: a launch that does not fit is skipped rather than risk the OOM killer)."""
    needed = copies_needed(scheme, collectors) * nbytes + (1 + collectors) * 300 * MB + 2**30
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if "MemAvailable" in line)
    text = f"needs about {needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"
    return needed <= available, text


def memcpy(nbytes: int, warmup: int, samples: int, source: str = "cpu") -> list[float]:
    """Copies of ``nbytes`` into CPU memory, ms (pinned when ``source`` is a GPU: the ``d2h``
    reference); the first ``warmup`` are not returned."""
    torch.set_num_threads(1)
    gpu = source.startswith("cuda")
    src = torch.ones(nbytes, dtype=torch.uint8, device=source)
    dst = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=gpu)
    out = []
    for _ in range(warmup + samples):
        start = time.monotonic()
        dst.copy_(src)  # from a GPU into pinned memory: complete when it returns
        out.append(1000 * (time.monotonic() - start))
    return out[warmup:]


def per_param_rank(rank: int, world: int, params: int, dtype: torch.dtype, total: int) -> dict:
    first_for_the_oom_killer()
    init_distributed(Layout.from_env(1), PROCESS_GROUP_TIMEOUT_S)
    tensors = [p.data for p in make_model(params, dtype).parameters()]
    stamp = torch.zeros(1, dtype=torch.float64)
    latencies = []
    for _ in range(total):
        dist.barrier()
        if rank == 0:
            stamp.fill_(time.monotonic())
        dist.broadcast(stamp, src=0)
        for t in tensors:
            dist.broadcast(t, src=0)
        if rank:
            latencies.append(1000 * (time.monotonic() - float(stamp)))
    dist.barrier()
    return {"ms": latencies, "maxrss_mb": maxrss_mb()}


def tcp_rank(rank: int, world: int, nbytes: int, total: int) -> dict:
    """``tcp``: rank 0 sends ``nbytes`` to every other rank over loopback sockets, at once."""
    first_for_the_oom_killer()
    init_distributed(Layout.from_env(1), PROCESS_GROUP_TIMEOUT_S)  # barriers and the port only
    server = socket.create_server(("127.0.0.1", 0)) if rank == 0 else None
    port = [server.getsockname()[1] if server else 0]
    dist.broadcast_object_list(port, src=0)
    if server:
        server.listen(world)
        conns = [server.accept()[0] for _ in range(world - 1)]
        server.close()
    else:
        conns = [socket.create_connection(("127.0.0.1", port[0]))]
    for conn in conns:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = np.ones(nbytes, dtype=np.uint8)  # every page touched, as a payload's
    view = memoryview(buffer.data)
    stamp = buffer[:8].view(np.int64)  # the clock travels in the bytes, as a header does
    latencies = []
    for _ in range(total):
        dist.barrier()
        if rank == 0:
            stamp[0] = time.monotonic_ns()
            if len(conns) == 1:  # no thread to start
                conns[0].sendall(view)
                continue
            senders = [threading.Thread(target=c.sendall, args=(view,)) for c in conns]
            for s in senders:
                s.start()
            for s in senders:
                s.join()
        else:
            _receive(conns[0], view)
            latencies.append((time.monotonic_ns() - int(stamp[0])) / 1e6)
    dist.barrier()
    for conn in conns:
        conn.close()
    return {"ms": latencies, "maxrss_mb": maxrss_mb()}


def _receive(conn: socket.socket, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = conn.recv_into(into[got:])
        if n == 0:
            raise ConnectionError(f"the sender closed after {got} of {len(into)} bytes")
        got += n


def copy_ack_rank(rank: int, world: int, params: int, dtype: torch.dtype, total: int) -> dict:
    """``shm_copy_ack``: rank 0 copies into shared memory and rings; every other rank wakes, notes
    the time, acknowledges."""
    from multiprocessing import shared_memory

    first_for_the_oom_killer()
    # barriers between samples, and the buffer's name; never in what is timed
    init_distributed(Layout.from_env(1), PROCESS_GROUP_TIMEOUT_S)
    # one buffer, as a trainer's
    packed = next(pack_parameters_(make_model(params, dtype)).parameters()).untyped_storage()
    source = torch.empty(0, dtype=torch.uint8).set_(packed)  # type: ignore[call-overload]
    # the harness's own naming: its stale-segment clean-up also finds this one
    name = [shm_files.new_name(0)]
    dist.broadcast_object_list(name, src=0)
    offset = -(-(3 + world) * 8 // 64) * 64
    if rank == 0:
        region = shared_memory.SharedMemory(name=name[0], create=True, size=offset + source.numel())
    dist.barrier()
    if rank:
        region = shared_memory.SharedMemory(name=name[0])
    try:
        ms = copy_ack_samples(rank, world, region.buf, offset, source, total)
        return {"ms": ms, "maxrss_mb": maxrss_mb()}
    finally:  # also after a failure: no segment outlives the benchmark
        if rank == 0:
            region.unlink()
        # a failure's traceback may still hold views of the buffer
        with contextlib.suppress(BufferError):
            region.close()


def copy_ack_samples(
    rank: int, world: int, buf, offset: int, source: torch.Tensor, samples: int
) -> list[float]:
    # [version, acknowledgement bell, the publish's clock in ns, the version each subscriber
    # acknowledged...]
    control = np.ndarray((3 + world,), dtype=np.int64, buffer=buf)
    target = torch.frombuffer(buf, dtype=torch.uint8, count=source.numel(), offset=offset)
    bell, ack_bell = control.ctypes.data, control.ctypes.data + 8
    latencies = []
    dist.barrier()
    for version in range(1, samples + 1):
        dist.barrier()
        if rank == 0:
            control[2] = time.monotonic_ns()
            target.copy_(source)
            control[0] = version
            futex.wake(bell)
            while True:
                # before looking: an acknowledgement after it ends the sleep at once
                rung = int(control[1])
                if all(control[3 + r] == version for r in range(1, world)):
                    break
                futex.wait(ack_bell, rung, 1.0)
        else:
            while int(control[0]) < version:
                futex.wait(bell, version - 1, 1.0)
            latencies.append((time.monotonic_ns() - int(control[2])) / 1e6)
            control[3 + rank] = version
            control[1] += (
                # not atomic: two subscribers may add one between them, but the word changes, which
                # is all a sleeper needs
                1
            )
            futex.wake(ack_bell)
    dist.barrier()
    return latencies
