"""The GRU's recurrence over a segment on a CPU, for learning: stepped in TorchScript, with a
hand-written backward (:class:`SteppedGRU`).

torch has no fused GRU kernel on a CPU: ``torch.gru`` (``nn.GRU``) steps the cell once per time
step and autograd records a dozen operations a step, each of whose backward runs on its own,
including a weight gradient (a matrix product and an accumulation) at every step. Here the
forward steps the same cell maths and keeps each step's gates; the backward steps back through
them for the gradients that are sequential (each step's state), and takes the weights' gradients
as one matrix product over all steps. Both loops run in TorchScript, whose interpreter calls an
operation for a fraction of what a Python line costs (in Python the same loops measured slower
than ``torch.gru``; 2026-12-06). Episode ends are a product inside the loop (the state times 0
after a step that ended its env's episode, :func:`harness.algos.memory.restarted`'s product),
so every env runs its whole segment in one pass, as the plain ``nn.GRU`` runs a sequence.

The cell's maths, as ATen's ``gru_cell``: ``r, z = sigmoid(W_ir x + b_ir + W_hr h + b_hr), ...``,
``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = n + z * (h - n)``; equal to
``torch.gru``'s to float rounding (tests/algos/test_recurrent.py holds values and gradients to a
cell stepped frame by frame).
"""

from __future__ import annotations

import warnings
from functools import cache
from typing import Any

import torch


def _forward(
    x: torch.Tensor,
    h: torch.Tensor,
    keep: torch.Tensor,
    ends: list[bool],
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Over ``x`` ``[T, N, D]`` from ``h`` ``[N, H]``, the state multiplied by ``keep[t]`` after
    each step ``t`` where ``ends[t]``: each step's output ``[T, N, H]``, the state it started
    from, its gates ``r, z, n`` ``[T, N, 3H]`` and ``W_hn h + b_hn`` ``[T, N, H]``."""
    steps, envs, size = x.shape[0], x.shape[1], h.shape[1]
    # every step's input projection in one matrix product, as torch.gru does on a CPU
    gi = torch.addmm(b_ih, x.reshape(steps * envs, -1), w_ih.t()).view(steps, envs, 3 * size)
    whh_t = w_hh.t()
    outs: list[torch.Tensor] = []
    starts: list[torch.Tensor] = []
    gates: list[torch.Tensor] = []
    hns: list[torch.Tensor] = []
    for t in range(steps):
        starts.append(h)
        gh = torch.addmm(b_hh, h, whh_t)
        gi_t = gi[t]
        rz = torch.sigmoid(gi_t[:, : 2 * size] + gh[:, : 2 * size])
        hn = gh[:, 2 * size :]
        n = torch.tanh(torch.addcmul(gi_t[:, 2 * size :], rz[:, :size], hn))
        h = n + rz[:, size:] * (h - n)
        outs.append(h)
        gates.append(torch.cat([rz, n], 1))
        hns.append(hn)
        if ends[t]:
            h = h * keep[t]
    return torch.stack(outs), torch.stack(starts), torch.stack(gates), torch.stack(hns)


def _backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    keep: torch.Tensor,
    ends: list[bool],
    starts: torch.Tensor,
    gates: torch.Tensor,
    hns: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the outputs' gradient ``grad`` ``[T, N, H]`` and what :func:`_forward` kept: the
    gradients of ``x``, of the first state, of ``w_ih``, ``w_hh``, ``b_ih`` and ``b_hh``."""
    steps, envs, size = grad.shape[0], grad.shape[1], grad.shape[2]
    d_gi: list[torch.Tensor] = []  # each step's gradient of W_i x + b_i (r, z, n)
    d_gh: list[torch.Tensor] = []  # and of W_h h + b_h
    dh = torch.zeros_like(grad[0])  # the gradient of the state the next step started from
    for i in range(steps):
        t = steps - 1 - i
        if ends[t]:
            dh = dh * keep[t]
        dh = dh + grad[t]  # the gradient of step t's output
        g = gates[t]
        r, z, n = g[:, :size], g[:, size : 2 * size], g[:, 2 * size :]
        d_an = dh * (1 - z) * (1 - n * n)  # through h' = n + z (h - n) and n = tanh(a_n)
        d_rz = torch.cat([d_an * hns[t] * r * (1 - r), dh * (starts[t] - n) * z * (1 - z)], 1)
        d_gi.append(torch.cat([d_rz, d_an], 1))
        d_gh.append(torch.cat([d_rz, d_an * r], 1))
        dh = torch.addmm(dh * z, d_gh[-1], w_hh)
    d_gi.reverse()
    d_gh.reverse()
    gi_all = torch.stack(d_gi).view(steps * envs, 3 * size)
    gh_all = torch.stack(d_gh).view(steps * envs, 3 * size)
    dx = torch.mm(gi_all, w_ih).view(x.shape)
    dw_ih = torch.mm(gi_all.t(), x.reshape(steps * envs, -1))
    dw_hh = torch.mm(gh_all.t(), starts.reshape(steps * envs, size))
    return dx, dh, dw_ih, dw_hh, gi_all.sum(0), gh_all.sum(0)


@cache
def _compiled() -> tuple[Any, Any]:
    """Both loops in TorchScript, compiled on first use (not at import). torch 2.13 calls
    ``torch.jit.script`` deprecated, pointing to ``torch.compile``, which on a CPU builds C++ for
    minutes and would unroll the loop per segment length; should a later torch drop TorchScript,
    the same functions run as Python: the same results, slower (docs/algorithms.md)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(_forward), torch.jit.script(_backward)
    except (AttributeError, RuntimeError):  # no TorchScript: the loops as written
        return _forward, _backward


class SteppedGRU(torch.autograd.Function):
    """``apply(x, state, keep, ends, w_ih, w_hh, b_ih, b_hh)``: a GRU cell's outputs ``[T, N, H]``
    over ``x`` ``[T, N, D]`` from ``state`` ``[N, H]``, the state multiplied by ``keep[t]``
    (``[T, N, 1]``) after each step ``t`` where ``ends[t]`` (a list of bools)."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        x, state, keep, ends, w_ih, w_hh, b_ih, b_hh = args
        out, starts, gates, hns = _compiled()[0](x, state, keep, ends, w_ih, w_hh, b_ih, b_hh)
        ctx.save_for_backward(x, keep, starts, gates, hns, w_ih, w_hh)
        ctx.ends = ends
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[torch.Tensor | None, ...]:
        x, keep, starts, gates, hns, w_ih, w_hh = ctx.saved_tensors
        dx, dstate, dw_ih, dw_hh, db_ih, db_hh = _compiled()[1](
            grads[0].contiguous(), x, keep, ctx.ends, starts, gates, hns, w_ih, w_hh
        )
        return dx, dstate, None, None, dw_ih, dw_hh, db_ih, db_hh


def stepped_gru(
    x: torch.Tensor, state: torch.Tensor, done: torch.Tensor, weights: list[torch.Tensor]
) -> torch.Tensor:
    """A GRU cell of ``weights`` (``w_ih, w_hh, b_ih, b_hh``) over ``x`` ``[T, N, D]`` from
    ``state`` ``[N, H]``, the state zeroed after each step that ended its env's episode
    (``done`` ``[T, N]``): the outputs ``[T, N, H]``."""
    keep = (~done).to(x.dtype).unsqueeze(-1)
    out: torch.Tensor = SteppedGRU.apply(x, state, keep, done.any(1).tolist(), *weights)
    return out
