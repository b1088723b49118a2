"""Policies with memory: a recurrent core (``algo.memory``: ``lstm`` or ``gru``) between the
encoder and the actor and critic heads, as CleanRL's ``ppo_atari_lstm.py`` and Sample Factory put
it.

The core is one LSTM or GRU cell: acting (a collector's step) steps it once per frame; learning (the
trainer's pass over a segment) runs the same recurrence on the same weights in torch's fused
``torch.lstm``/``torch.gru`` over the segment's pieces between episode ends, in one call or in
groups of similar lengths (:meth:`RecurrentActorCritic.unroll`, :func:`groups`); a GRU on a CPU, in
a TorchScript loop with its own backward (:mod:`harness.algos.gru_loop`); the same maths in the
same order, so that both agree on every log-probability and value to float rounding. Its state
is a flat ``[N, state_size]`` tensor (an LSTM's hidden and cell states side by side) that collectors
carry from step to step, zeroed where an episode ended (:func:`restarted`), and record at the start
of every segment (``INITIAL_STATE`` in the batch). The trainer replays a segment from that state,
zeroing it again where the segment's episodes ended, before the step that follows (CleanRL
multiplies the state by ``1 - done`` the same way): the state never crosses an episode boundary, at
acting and at learning alike. PPO learns from minibatches of whole env sequences
(:func:`sequences`): truncated backpropagation through time over each segment.
"""

from __future__ import annotations

from itertools import pairwise
from typing import ClassVar

import torch
from tensordict import TensorDict
from torch import nn
from torch.nn import functional as F

from harness.algos.gru_loop import stepped_gru
from harness.algos.memory_act import act_step, tanh_mlp
from harness.algos.nets import encoder
from harness.core.specs import EnvSpec

MEMORIES = ("none", "lstm", "gru")
# The policy's output after a step: each env's state after it (not stored per frame).
STATE = "state"
# The batch's entry [N, state_size]: each env's state before the segment's first step.
INITIAL_STATE = "initial_state"


def check_memory(memory: str) -> None:
    """Refuse an ``algo.memory`` that is not one of ``MEMORIES``, saying what is."""
    if memory not in MEMORIES:
        raise ValueError(
            f"algo.memory={memory!r}: choose none (a feed-forward policy), lstm or gru (a "
            "recurrent core of algo.memory_size units between the encoder and the heads)"
        )


def restarted(state: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """``state`` ``[N, S]`` zeroed for the envs whose episode ended (``done`` ``[N]``): the state
    the next step starts from. A product, as CleanRL's, so that collector and trainer compute the
    same bits."""
    return state * (~done).to(state.dtype).unsqueeze(-1)


class RecurrentActorCritic(nn.Module):
    """Encoder (the MLP's hidden layers, or the CNN), one LSTM or GRU cell of ``size`` units, and
    on its output the actor's head (``outputs`` wide) and the critic's value head."""

    def __init__(self, spec: EnvSpec, hidden: list[int], kind: str, size: int, outputs: int):
        super().__init__()
        self.encoder, features = encoder(spec, hidden)
        self.lstm = kind == "lstm"
        self.cell = nn.LSTMCell(features, size) if self.lstm else nn.GRUCell(features, size)
        for name, param in self.cell.named_parameters():  # CleanRL's ppo_atari_lstm.py
            if "bias" in name:
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.state_size = 2 * size if self.lstm else size
        self._linears: list[nn.Linear] | None = None  # sample()'s encoder layers, or [] (a CNN)
        # The actor's head (the first ``outputs`` rows) and the value head (the last) in one layer:
        # one matrix product for both, initialised as CleanRL initialises the two.
        self.heads = nn.Linear(size, outputs + 1)
        nn.init.constant_(self.heads.bias, 0.0)
        nn.init.orthogonal_(self.heads.weight[:outputs], 0.01)
        nn.init.orthogonal_(self.heads.weight[outputs:], 1.0)

    def initial_state(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """``n`` envs' state at an episode's start: zeros, on ``like``'s device."""
        return torch.zeros(n, self.state_size, device=like.device)

    def _heads(
        self, out: torch.Tensor, contiguous: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output and the value (float32) of the core's output ``out``; the actor's
        output copied out of the shared layer's rows where ``contiguous``: in learning the loss's
        log-softmax and its backward on a strided view cost more than the copy (the update
        measured 6-7% faster with it); acting on 16 envs measured no gain, so it takes the view."""
        both = F.linear(out, self.heads.weight, self.heads.bias)
        actor = both[..., :-1]
        return actor.contiguous() if contiguous else actor, both[..., -1].float()

    def step(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One frame of each env (``obs`` ``[N, D]``, flat) from its ``state``: the actor's
        output, the value and the state after the step. The cell is ATen's own (``gru_cell``,
        ``lstm_cell``, which ``nn.GRUCell``/``nn.LSTMCell`` call and ``torch.gru``/``torch.lstm``
        step with), called on the weights directly: a collector steps it once per frame, and the
        module's call and its argument checks cost as much as the cell's arithmetic."""
        x, cell = self.encoder(obs), self.cell
        weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        if self.lstm:
            h, c = torch.lstm_cell(x, state.chunk(2, -1), *weights)
            state = torch.cat([h, c], -1)
        else:
            h = state = torch.gru_cell(x, state, *weights)
        return *self._heads(h, contiguous=False), state

    def sample(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :meth:`step` and sampling the actor's categorical distribution give, in one
        function of tensors (:func:`harness.algos.memory_act.act_step`; a CNN encoder runs first,
        as a module): each env's sampled action, its log-probability, the value and the state
        after the step. For discrete actions."""
        if self._linears is None:  # the encoder's layers, looked up once
            self._linears = tanh_mlp(self.encoder)
        x = obs if self._linears else self.encoder(obs)
        return act_step(x, state, self._linears, self.cell, self.heads)

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, done: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A segment, time first (``obs`` ``[T, N, D]``, ``done`` ``[T, N]``) from each env's
        ``state`` before its first step: the actor's outputs ``[T, N, A]`` and the values
        ``[T, N]``. A state is zeroed after each step that ended its env's episode, as the
        collector zeroed it while acting.

        The same maths as stepping the cell, in torch's fused recurrence (``torch.lstm`` /
        ``torch.gru`` on the cell's own weights): each env's sequence is cut into its pieces
        between episode ends, each starting from its state (the recorded one, or zeros after an
        end). Pieces of similar lengths run side by side in one call, padded at their end to the
        longest of their group (:func:`groups`); only each piece's own steps are read back. A GRU
        on a CPU runs instead every env's whole segment in one stepped pass, the state zeroed
        inside it (:mod:`harness.algos.gru_loop`; :meth:`stepped`)."""
        features = self.encoder(obs)  # every frame at once: the encoder has no state
        return self._heads(self.recurrence(features, state, done))

    def recurrence(
        self, features: torch.Tensor, state: torch.Tensor, done: torch.Tensor
    ) -> torch.Tensor:
        """The recurrence alone of :meth:`unroll`: the core's outputs ``[T, N, size]`` over the
        encoder's ``features`` ``[T, N, F]`` from ``state``, restarted after episode ends (what
        benchmarks/recurrent.py times against a plain ``nn.LSTM``/``nn.GRU``)."""
        if self.stepped(features):  # the GRU on a CPU: every env whole, in one stepped pass
            cell = self.cell
            weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
            return stepped_gru(features, state, done, weights)
        steps, envs = done.shape
        piece, pos, first = pieces(done)
        # a piece's start state: its env's recorded one, zeroed unless the piece starts at step 0
        start = restarted(state[first // steps], first % steps != 0)
        lengths = torch.bincount(piece, minlength=len(first)).tolist()
        order, bounds = groups(lengths, self.CALL_COSTS["lstm" if self.lstm else "gru"])
        # each piece's first row and its stride (its group's width) in the groups' [L, B] blocks
        base, stride, offset = [0] * len(first), [0] * len(first), 0
        for lo, hi in pairwise(bounds):
            for column, p in enumerate(order[lo:hi]):
                base[p], stride[p] = offset + column, hi - lo
            offset += lengths[order[lo]] * (hi - lo)
        base_, stride_ = (torch.tensor(v, device=done.device) for v in (base, stride))
        # each frame's row, in time-major order: what comes back is [T, N], contiguous
        where = (base_[piece] + pos * stride_[piece]).view(envs, steps).t().reshape(-1)
        frames = features.flatten(0, 1)
        x = frames.new_zeros(offset, frames.shape[1]).index_copy(0, where, frames)
        start = start[torch.tensor(order, device=done.device)]
        outs, row = [], 0
        for lo, hi in pairwise(bounds):
            rows = lengths[order[lo]] * (hi - lo)
            block = x[row : row + rows].view(-1, hi - lo, frames.shape[1])
            outs.append(self._fused(block, start[lo:hi]).flatten(0, 1))
            row += rows
        out = torch.cat(outs).index_select(0, where)  # index_select: its backward adds, no sort
        return out.view(steps, envs, -1)

    # groups()'s costs by kind: what a fused call costs, in frames (a frame: one piece's one step),
    # and what each of its time steps costs besides its pieces' frames. On a CPU torch.lstm runs
    # oneDNN's fused kernel, whose time grows with pieces x length (padding costs) and which costs
    # more per call: groups of similar lengths, the constants that measured fastest in
    # benchmarks/recurrent.py's update on this repository's CPU machine. torch.gru has no fused
    # CPU kernel and steps the cell once per time step, about as fast for any number of pieces: one
    # call for all (None).
    CALL_COSTS: ClassVar[dict[str, tuple[float, float] | None]] = {"lstm": (32.0, 8.0), "gru": None}

    def stepped(self, features: torch.Tensor) -> bool:
        """Whether a GRU's segment runs in :func:`~harness.algos.gru_loop.stepped_gru` (on a CPU,
        in float32: faster there than torch.gru's autograd, benchmarks/recurrent.py) rather than
        in torch's fused call over pieces (an LSTM: oneDNN's kernel; a GPU: cuDNN's)."""
        device = features.device.type
        return (
            not self.lstm
            and device == "cpu"
            and features.dtype == torch.float32
            and not torch.is_autocast_enabled(device)
        )

    def _fused(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The cell over ``x`` ``[L, B, D]`` from ``state`` ``[B, state_size]``, without
        restarts, in one call: the outputs ``[L, B, size]``."""
        cell, train = self.cell, self.training
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        if self.lstm:
            h, c = state.unsqueeze(0).chunk(2, -1)
            return torch.lstm(x, (h, c), weights, True, 1, 0.0, train, False, False)[0]
        return torch.gru(x, state.unsqueeze(0), weights, True, 1, 0.0, train, False, False)[0]


def pieces(done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``[T, N]`` segment's ``done`` flags cut each env's sequence into pieces that no episode
    end interrupts (a piece starts at step 0 and after each end), numbered env by env: each
    frame's piece and step within it (both ``[N * T]``, env-major), and each piece's first
    frame's index in that order (``[pieces]``: its env is ``// T``, its step ``% T``)."""
    starts = torch.ones_like(done)
    starts[1:] = done[:-1]
    starts = starts.transpose(0, 1).reshape(-1)
    first = starts.nonzero().squeeze(1)
    piece = starts.cumsum(0) - 1
    pos = torch.arange(len(starts), device=done.device) - first[piece]
    return piece, pos, first


def groups(lengths: list[int], costs: tuple[float, float] | None) -> tuple[list[int], list[int]]:
    """Pieces of ``lengths`` in groups, each run in one fused call padded to its longest piece:
    the pieces longest first (``order``), and the groups as ranges of that order (``bounds``:
    group ``g`` is ``order[bounds[g]:bounds[g + 1]]``). ``costs``: what a call costs, in frames
    (a frame: one piece's one step), and what each of its time steps costs besides its pieces'
    frames; the groups minimise the sum over groups of ``call + longest x (step + pieces)``
    (dynamic programming over the cuts between different lengths). One group where ``costs`` is
    None."""
    order = sorted(range(len(lengths)), key=lambda p: -lengths[p])
    if costs is None:
        return order, [0, len(order)]
    call, step = costs
    ordered = [lengths[p] for p in order]
    cuts = [i for i in range(len(ordered)) if i == 0 or ordered[i] != ordered[i - 1]]
    cuts.append(len(ordered))
    best, back = {0: 0.0}, {0: 0}  # cut -> least cost of the pieces before it, its last group
    for j in cuts[1:]:
        best[j], back[j] = min(
            (best[i] + call + ordered[i] * (step + j - i), i) for i in cuts if i < j
        )
    bounds = [len(ordered)]
    while bounds[-1]:
        bounds.append(back[bounds[-1]])
    return order, bounds[::-1]


def sequences(frames: TensorDict, initial_state: torch.Tensor) -> TensorDict:
    """A round's ``[T, N]`` ``frames`` as ``[N]`` env sequences ``[N, T, ...]``, each with the
    state it started from: indexing it picks whole sequences, so that no minibatch cuts one."""
    envs = frames.shape[1]
    by_env = {key: value.transpose(0, 1) for key, value in frames.items()}
    return TensorDict(by_env, batch_size=[envs], device=frames.device).set(
        INITIAL_STATE, initial_state
    )


def time_major(minibatch: TensorDict) -> tuple[TensorDict, torch.Tensor]:
    """A minibatch of :func:`sequences` as ``[T, B]`` frames, and their starting states."""
    state = minibatch[INITIAL_STATE]
    # contiguous: every op of the loss and its backward on strided [T, B] views costs more
    frames = {k: v.transpose(0, 1).contiguous() for k, v in minibatch.items() if k != INITIAL_STATE}
    steps, envs = minibatch["done"].shape[1], minibatch.shape[0]
    return TensorDict(frames, batch_size=[steps, envs], device=minibatch.device), state
