"""Two nodes on one machine, each with a network interface of its own (tests
and benchmarks).

Two network namespaces joined by a veth pair with private addresses: a rank
started in one (``ip netns exec``) reaches the other only over the veth, as a
node reaches another over its NIC, and Gloo binds to the veth
(``GLOO_SOCKET_IFNAME``). The two still share one kernel: the same
``/dev/shm``, process ids and clock. Making namespaces needs root and
iproute2's ``ip``; where they cannot be made, :class:`NamespaceError` says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.0"  # private addresses: inside fresh namespaces nothing else uses them
PORT = 29400  # the rendezvous port on the first node (a fresh namespace has every port free)


class NamespaceError(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, no permission)."""


def ip_command() -> str:
    """iproute2's ``ip``, also where ``/usr/sbin`` is not on the path."""
    found = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/bin/ip") if Path(p).exists()), None
    )
    if found is None:
        raise NamespaceError("iproute2's ip is not installed (apt-get install iproute2)")
    return found


@dataclass(frozen=True)
class Node:
    """One simulated node: its namespace, its end of the veth and its address."""

    namespace: str
    interface: str
    address: str

    def run(self, argv: list[str]) -> list[str]:
        """``argv`` as a command that runs inside this node's namespace."""
        return [ip_command(), "netns", "exec", self.namespace, *argv]

    def env(self) -> dict[str, str]:
        """What a launch on this node needs in its environment: Gloo on the veth."""
        return {"GLOO_SOCKET_IFNAME": self.interface}

    def bytes_received(self) -> int:
        """Bytes that arrived on this node's veth so far."""
        out = _ip("-n", self.namespace, "-s", "-j", "link", "show", "dev", self.interface)
        return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])

    def torchrun(
        self, node_rank: int, head: Node, nproc: int, argv: list[str], run_id: str = "two-nodes"
    ) -> list[str]:
        """``torchrun`` for this node of a 2-node job whose c10d rendezvous
        lives on ``head``. The head hosts the rendezvous store (``is_host``:
        its address is not what the machine's hostname resolves to), and each
        node gives its own address for the ranks to meet at (``--local_addr``)."""
        torchrun = str(Path(sys.executable).parent / "torchrun")
        return self.run(
            [
                torchrun,
                "--nnodes=2",
                f"--node_rank={node_rank}",
                f"--nproc_per_node={nproc}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={head.address}:{PORT}",
                f"--rdzv_id={run_id}",
                f"--rdzv_conf=is_host={int(self == head)},join_timeout=120",
                f"--local_addr={self.address}",
                *argv,
            ]
        )


def _ip(*args: str) -> str:
    try:
        return subprocess.run(
            [ip_command(), *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout
    except subprocess.CalledProcessError as e:
        raise NamespaceError(f"ip {' '.join(args)} failed: {e.stderr.strip()}") from e


@contextmanager
def two_nodes(tag: str = "") -> Iterator[tuple[Node, Node]]:
    """Two namespaces joined by a veth pair, ``SUBNET.1`` and ``SUBNET.2``;
    removed on exit, also when what ran inside failed (deleting a namespace
    deletes its end of the veth, and with it the pair)."""
    if os.geteuid() != 0:
        raise NamespaceError("making network namespaces needs root (ip netns add)")
    stem = f"h{os.getpid()}{tag}"[:12]  # interface names have at most 15 characters
    nodes = tuple(Node(f"harness-{stem}-{i}", f"{stem}v{i}", f"{SUBNET}.{i + 1}") for i in range(2))
    made: list[str] = []
    try:
        for node in nodes:
            _ip("netns", "add", node.namespace)
            made.append(node.namespace)
        a, b = nodes
        _ip(
            "link",
            "add",
            a.interface,
            "netns",
            a.namespace,
            "type",
            "veth",
            "peer",
            "name",
            b.interface,
            "netns",
            b.namespace,
        )
        for node in nodes:
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.interface)
            _ip("-n", node.namespace, "link", "set", node.interface, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
        yield a, b
    finally:
        for namespace in made:
            subprocess.run(
                [ip_command(), "netns", "del", namespace], capture_output=True, timeout=30
            )
