"""A recurrent policy's acting step (a collector's frame: encoder, cell, heads, the action's
sample and log-probability) as one function of tensors (:func:`act_step`), without the modules'
calls and without building a ``torch.distributions.Categorical``.

A collector steps its policy once per frame on a few envs (16 in ``ppo_popgym``). Through the
modules and ``Categorical`` a GRU policy's step measured ~210 µs, of which the operations
themselves (the cell's two matrix products most) are about 110-160 (benchmarks/recurrent.py,
docs/algorithms.md). The operations here are the ones the module path runs, in the same order, on
the same weights (``Categorical``'s normalised logits, its ``softmax`` probabilities and
``multinomial`` draw, its ``gather`` for the log-probability): the same actions for the same random
state, the same bits (tests/algos/test_recurrent.py holds them to torch's modules and
``Categorical``). The same function in TorchScript measured no faster here (162 against 156 µs,
2026-12-07): what is left is the operations' own time, not Python's. Discrete actions only, sampled
(not the evaluation's mode), and not under autocast: the rest acts through the modules
(:meth:`harness.algos.memory.RecurrentActorCritic.step`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def act_step(
    obs: torch.Tensor,
    state: torch.Tensor,
    linears: Sequence[nn.Linear],
    cell: nn.LSTMCell | nn.GRUCell,
    heads: nn.Linear,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One frame of each env (``obs`` ``[N, D]``: the observation, or the encoder's features when
    ``linears`` is empty) from its ``state`` ``[N, S]``: the sampled action, its log-probability,
    the value and the state after the step. The encoder: ``linears``, each followed by ``tanh``
    (:func:`harness.algos.nets.hidden_layers`); ``heads``: the actor's rows, then the value's."""
    x = obs
    for linear in linears:
        x = torch.tanh(F.linear(x, linear.weight, linear.bias))
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    if isinstance(cell, nn.LSTMCell):
        h, c = torch.lstm_cell(x, state.chunk(2, -1), *weights)
        state = torch.cat([h, c], -1)
    else:
        h = state = torch.gru_cell(x, state, *weights)
    both = F.linear(h, heads.weight, heads.bias)
    logits = both[:, :-1].float()  # Categorical(logits=...): normalised, then softmax to sample
    logits = logits - logits.logsumexp(-1, keepdim=True)
    action = torch.multinomial(torch.softmax(logits, -1), 1, True)
    logprob = logits.gather(-1, action).squeeze(-1)
    return action.squeeze(1), logprob, both[:, -1].float(), state


def tanh_mlp(encoder: nn.Module) -> list[nn.Linear]:
    """The linear layers of ``encoder`` if it is linear layers each followed by ``tanh`` (what
    :func:`act_step` computes itself from their weights), else none (a CNN: run as a module
    first). An empty encoder (no hidden layers) is the observation itself: also none."""
    layers = list(encoder.children()) if isinstance(encoder, nn.Sequential) else [encoder]
    linears, activations = layers[0::2], layers[1::2]
    if len(linears) == len(activations) and all(
        isinstance(a, nn.Tanh) and isinstance(lin, nn.Linear) and lin.bias is not None
        for lin, a in zip(linears, activations)
    ):
        return [lin for lin in linears if isinstance(lin, nn.Linear)]
    return []
