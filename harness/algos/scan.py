"""A discounted sum along time in log2(T) tensor steps: the core of GAE, V-trace and the running
return that scales rewards.

Both estimators solve ``y_t = x_t + d_t * y_{t+1}`` (``y_T = 0``) over a ``[T, ...]`` rollout,
with a discount ``d_t`` that differs per step (zero where an episode ends; V-trace's truncated
ratios). A Python loop over ``t`` costs T interpreter round trips (T kernel launches each on a
GPU); the recurrence is a first-order linear one, so pairs ``(d, x)`` compose associatively,

    (d1, x1) then (d2, x2) = (d1 * d2, x1 + d1 * x2),

and a doubling scan (Hillis and Steele 1986; the "parallel scan" of linear RNNs) solves it in
``ceil(log2 T)`` rounds of three elementwise operations over the whole rollout. After round ``k``,
``y_t`` holds the sum of the next ``2**k`` terms and ``d_t`` their discount product, so the
discounts only ever shrink towards zero: nothing overflows, whatever ``T`` and the discounts.
"""

from __future__ import annotations

import torch


def discounted_suffix_sum(x: torch.Tensor, discount: torch.Tensor) -> torch.Tensor:
    """``y`` with ``y_t = x_t + discount_t * y_{t+1}`` along dim 0 and ``y_T = 0``; the terms of
    the sum are added in a different order than a loop adds them (equal to float rounding)."""
    y, d = x.clone(), discount.to(x.dtype).clone()
    span, steps = 1, x.shape[0]
    while span < steps:
        # Each right-hand side is made in full before it is written: round k reads round k-1's.
        y[:-span] += d[:-span] * y[span:]
        d[:-span] = d[:-span] * d[span:]
        span *= 2
    return y


def discounted_prefix_sum(x: torch.Tensor, discount: torch.Tensor) -> torch.Tensor:
    """``y`` with ``y_t = x_t + discount_t * y_{t-1}`` along dim 0 and ``y_{-1} = 0``: the same
    scan forwards in time (a running discounted return)."""
    return discounted_suffix_sum(x.flip(0), discount.flip(0)).flip(0)
