"""Two nodes for benchmarks/chaos.py (``--nodes 2``), and ``link_drop``.

Two network namespaces joined by a veth pair (:mod:`harness.testing.netns`: root and iproute2),
one torchrun agent in each, ``--max-restarts`` on both, meeting at a c10d rendezvous on the first
node's address; Gloo binds to the veth, the only way between them. Each node runs half the ranks:
the trainers and the first collectors on node 0, the other collectors on node 1. ``link_drop``
takes node 1's end of the veth down for ``--drop-s`` seconds, then up again: every connection
between the nodes (rendezvous, store, Gloo) sees nothing pass meanwhile, as when a switch port
flaps; nothing is closed, so it is the harness's bounded waits that must notice.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.testing.netns import PORT, Node, ip_command

# The agents' rendezvous store client waits this long for an answer (torchrun's c10d default: 60
# s). A request sent while the link is down is answered only when TCP retransmits it, and each
# retransmission waits twice as long as the one before (up to 120 s): drops back to back, with the
# link up for a second or so between them, left a request of node 1's agent unanswered for its 60
# s (2026-12-07, seed 5), the agent exited, closing the rendezvous, and node 0's restart failed
# (RendezvousClosedError).
STORE_TIMEOUT_S = 300
# How long a restart's rendezvous waits for the other node's agent (was 120 s). After a long drop
# (130 s, 2026-12-07) node 1's agent's store connection stayed silent for another minute or two
# after the link came back (TCP's probe timer backed off to TCP_RTO_MAX, 120 s, while its own
# link was down: `ss` said `timer:(persist,1min10sec,9)`), and node 0's rendezvous, waiting 120 s,
# gave up first (RendezvousTimeoutError).
JOIN_TIMEOUT_S = 600

if TYPE_CHECKING:
    import argparse

    from chaos import Job


def node_commands(
    nodes: tuple[Node, Node], per_node: int, argv: list[str], args: argparse.Namespace, tag: str
) -> list[tuple[list[str], dict[str, str]]]:
    """Each node's torchrun agent: its command and what its environment adds."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    head = nodes[0]
    return [
        (
            node.run(
                [
                    torchrun,
                    "--nnodes=2",
                    f"--node_rank={i}",
                    f"--nproc_per_node={per_node}",
                    "--rdzv_backend=c10d",
                    f"--rdzv_endpoint={head.address}:{PORT}",
                    f"--rdzv_id=chaos-{tag[:8]}",
                    f"--rdzv_conf=is_host={int(node == head)},join_timeout={JOIN_TIMEOUT_S},"
                    f"read_timeout={STORE_TIMEOUT_S}",
                    f"--local_addr={node.address}",
                    f"--max-restarts={args.max_restarts}",
                    *argv,
                ]
            ),
            node.env(),
        )
        for i, node in enumerate(nodes)
    ]


def link_drop_fault(job: Job, args: argparse.Namespace) -> dict[str, Any]:
    """Node 1's end of the veth down for ``--drop-s``, then up, on a timer of its own: the drop
    lasts ``--drop-s`` whether or not the job names it meanwhile. (It used to come up only once a
    line named it: the stall of 2026-12-07, ``nodes2``, where no line named a trainer waiting for
    any collector's batch, was a link down for 120 s, not 10 s.) Noticed: the first line after
    the drop that names a late or lost peer; whole again: the line that says the wait ended, or
    the resumed run's first row after a restart."""
    assert job.nodes is not None  # chaos.unfit skips it on one node
    node = job.nodes[1]
    link = [ip_command(), "-n", node.namespace, "link", "set", node.interface]
    up_at: list[float] = []

    def link_up() -> None:
        subprocess.run([*link, "up"], check=True)
        up_at.append(time.monotonic())

    at = time.monotonic()
    subprocess.run([*link, "down"], check=True)
    timer = threading.Timer(args.drop_s, link_up)
    timer.start()
    try:
        named = r"no batch from any|has sent no batch|had not applied|failed \(exitcode|[Ee]rror"
        noticed = job.wait_line(named, at, args.drop_s + 120)
    finally:
        timer.join()  # up, whatever happened meanwhile
    back = r"sent a batch again|reached every receiver|resumed from"
    whole = job.wait_line(back, at, args.drop_s + 180) if noticed else None
    return {
        "target": f"{node.interface} ({node.namespace}) down for {args.drop_s:g} s",
        "at": at,
        "down_s": round(up_at[0] - at, 2) if up_at else None,  # as measured
        "noticed": noticed,
        "whole": whole,
    }
