"""Clipped value loss for the critic (PPO with GAE)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algos.loss_agg import LossAggMode, agg_loss
from agentrl.algos.ops import Metrics, masked_mean


class ValueLossOutput(NamedTuple):
    loss: Tensor
    metrics: Metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip_range: float,
    loss_agg_mode: LossAggMode = "token-mean",
    *,
    norm_constant: float | None = None,
    denominator: float | Tensor | None = None,
) -> ValueLossOutput:
    """``0.5 · agg(max((V - R)², (clip(V, V_old ± clip_range) - R)²))``.

    Metrics: ``vf_clipfrac`` (tokens where the clipped error is the larger one) and
    ``vpred_mean`` (mean predicted value).
    """
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    err = (values - returns).square()
    err_clipped = (clipped - returns).square()
    loss = 0.5 * agg_loss(
        torch.maximum(err, err_clipped),
        response_mask,
        loss_agg_mode,
        norm_constant=norm_constant,
        denominator=denominator,
    )
    metrics = {
        "vf_clipfrac": masked_mean((err_clipped > err).float(), response_mask),
        "vpred_mean": masked_mean(values.detach(), response_mask),
    }
    return ValueLossOutput(loss, metrics)
