"""Rollout importance sampling: correct the rollout/training policy mismatch.

The rollout engine (e.g. vLLM in bf16) and the trainer (e.g. FSDP in fp32) give
slightly different probabilities to the same tokens, so the samples come from
``π_rollout`` while the loss assumes ``π_old``. Per token,
``log ρ_t = log π_old(a_t) - log π_rollout(a_t)``, and the weight is

- ``token``: ``w_t = exp(log ρ_t)``;
- ``sequence``: ``w_t = exp(Σ_{t'} log ρ_{t'})`` (the product of the row's ratios);
- ``geometric``: ``w_t = exp(mean_{t'} log ρ_{t'})`` (their geometric mean).

Then, with thresholds ``lower ≤ upper`` (``lower = 1/upper`` by default):

- ``truncate`` (TIS): ``w ← min(w, upper)``;
- ``mask`` (MIS): ``w ← w · 1[lower ≤ w ≤ upper]``;
- veto: a row with any token ``ρ_t < veto_threshold`` gets weight 0 everywhere.

Everything is computed in log space; log-weights are clamped to ±20 before ``exp``
(bounds are tested on the unclamped value). Weights are detached and 0 on masked
tokens. They multiply the per-token loss of every policy loss in
:mod:`agentrl.algos.policy_losses`.

Metrics (prefix ``mismatch/``) describe the weights *before* truncation, masking
and veto (``rollout_is_mean/std/min/max/p25/p50/p75/p95/p99``, token-weighted over
unmasked tokens), except ``rollout_is_eff_sample_size``, the effective sample size
``(mean w)² / mean(w²)`` of the weights as applied (a fraction of the tokens). For
the ``sequence`` and ``geometric`` levels, ``rollout_is_seq_*`` describe one weight
per non-empty row.
"""

from __future__ import annotations

import math
from typing import NamedTuple, get_args

import torch
from torch import Tensor

from agentrl.algos.config import RolloutISLevel, RolloutISMode, resolve_is_thresholds
from agentrl.algos.ops import Metrics, masked_mean

LOG_WEIGHT_BOUND = 20.0
PERCENTILES = (25, 50, 75, 95, 99)
PREFIX = "mismatch/"


class RolloutIS(NamedTuple):
    weights: Tensor | None
    """``[B, T]`` weights, or None when rollout IS is off or in metrics-only mode."""
    metrics: Metrics


def compute_rollout_is_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    threshold: float | None,
    threshold_lower: float | None = None,
    level: RolloutISLevel = "token",
    mode: RolloutISMode = "truncate",
    veto_threshold: float | None = 1e-4,
    apply_weights: bool = True,
) -> RolloutIS:
    """Rollout IS weights and ``mismatch/`` metrics (see the module docstring).

    ``threshold=None`` switches rollout IS off: no weights and no metrics.
    ``apply_weights=False`` (config ``rollout_is: false``) computes every metric but
    returns no weights.
    """
    if threshold is None:
        return RolloutIS(None, {})
    upper, lower = resolve_is_thresholds(threshold, threshold_lower)
    if level not in get_args(RolloutISLevel):
        raise ValueError(f"unknown rollout_is_level {level!r}; choose token, sequence or geometric")
    if mode not in get_args(RolloutISMode):
        raise ValueError(f"unknown rollout_is_mode {mode!r}; choose truncate or mask")
    if veto_threshold is not None and not veto_threshold > 0:
        raise ValueError(f"rollout_is_veto_threshold must be > 0 or None, got {veto_threshold}")

    valid = response_mask.bool()
    zero = torch.zeros((), dtype=old_log_prob.dtype, device=old_log_prob.device)
    log_ratio = torch.where(valid, old_log_prob.detach() - rollout_log_prob.detach(), zero)
    if level == "token":
        log_w = log_ratio
    elif level == "sequence":
        log_w = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    else:
        log_w = masked_mean(log_ratio, valid, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    raw = log_w.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND).exp()

    log_upper = math.log(upper)
    log_lower = math.log(lower) if lower > 0 else -math.inf
    in_bounds = (log_w >= log_lower) & (log_w <= log_upper)
    bounded = raw.clamp(max=upper) if mode == "truncate" else torch.where(in_bounds, raw, zero)
    if veto_threshold is None:
        catastrophic = torch.zeros_like(valid)
    else:
        catastrophic = valid & (log_ratio < math.log(veto_threshold))
    vetoed = catastrophic.any(dim=-1)
    weights = torch.where(valid & ~vetoed.unsqueeze(-1), bounded, zero)

    nonempty = valid.any(dim=-1)
    metrics = _weight_metrics(raw, weights, valid)
    metrics["rollout_is_veto_fraction"] = masked_mean(vetoed.double(), nonempty)
    metrics["rollout_is_catastrophic_token_fraction"] = masked_mean(catastrophic.double(), valid)
    if mode == "mask":
        metrics["rollout_is_masked_fraction"] = masked_mean((~in_bounds).double(), valid)
    if level != "token":
        metrics |= _sequence_metrics(raw[:, 0][nonempty].double(), upper, lower)
    result = {PREFIX + k: v for k, v in metrics.items()}
    result |= compute_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask)
    return RolloutIS(weights if apply_weights else None, result)


def compute_mismatch_metrics(
    old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor
) -> Metrics:
    """How far the training policy is from the rollout policy on the rollout's tokens.

    With ``d_t = log π_old - log π_rollout`` over unmasked tokens (samples from the
    rollout policy) and per-row ``log PPL = -mean_t log π`` (non-empty rows):

    - ``mismatch_kl = mean(-d)``: k1 estimate of KL(π_rollout‖π_old);
    - ``mismatch_k3_kl = mean(e^d - d - 1)`` (``d`` clamped to ±20): k3 estimate;
    - ``mismatch_{training,rollout}_log_ppl``: mean log PPL; ``..._ppl``: mean PPL;
    - ``mismatch_log_ppl_diff``: mean of ``log PPL_old - log PPL_rollout`` per row, and
      ``_abs_diff`` (mean abs), ``_diff_max``, ``_diff_min``;
    - ``mismatch_ppl_ratio``: mean of ``PPL_old / PPL_rollout`` per row.

    All keys carry the ``mismatch/`` prefix; computed in float64.
    """
    # Over the unmasked tokens only: a padded batch's rows are as long as its longest.
    valid = response_mask.bool()
    counts = valid.sum(dim=-1)
    rows = counts > 0
    old = old_log_prob.detach()[valid].double()
    rollout = rollout_log_prob.detach()[valid].double()
    row_of = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    d = old - rollout
    d_safe = d.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND)

    def row_means(x: Tensor) -> Tensor:
        sums = torch.zeros(len(counts), dtype=x.dtype, device=x.device).index_add_(0, row_of, x)
        return sums[rows] / counts[rows]

    train_log_ppl = -row_means(old)
    rollout_log_ppl = -row_means(rollout)
    log_ppl_diff = train_log_ppl - rollout_log_ppl
    metrics = {
        "mismatch_kl": _mean(-d),
        "mismatch_k3_kl": _mean(d_safe.exp() - d_safe - 1),
        "mismatch_training_log_ppl": _mean(train_log_ppl),
        "mismatch_training_ppl": _mean(train_log_ppl.exp()),
        "mismatch_rollout_log_ppl": _mean(rollout_log_ppl),
        "mismatch_rollout_ppl": _mean(rollout_log_ppl.exp()),
        "mismatch_ppl_ratio": _mean(log_ppl_diff.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND).exp()),
        "mismatch_log_ppl_diff": _mean(log_ppl_diff),
        "mismatch_log_ppl_abs_diff": _mean(log_ppl_diff.abs()),
        "mismatch_log_ppl_diff_max": _max(log_ppl_diff),
        "mismatch_log_ppl_diff_min": _min(log_ppl_diff),
    }
    return {PREFIX + k: v for k, v in metrics.items()}


def _weight_metrics(raw: Tensor, weights: Tensor, valid: Tensor) -> Metrics:
    values = raw[valid].double()
    mean = _mean(values)
    metrics = {
        "rollout_is_mean": mean,
        "rollout_is_std": _mean((values - mean).square()).sqrt(),
        "rollout_is_min": _min(values),
        "rollout_is_max": _max(values),
    }
    for p, q in zip(PERCENTILES, _quantiles(values, [p / 100 for p in PERCENTILES]), strict=True):
        metrics[f"rollout_is_p{p}"] = q
    applied = weights[valid].double()
    # All-zero applied weights (everything masked or vetoed) give an ESS of 0, not nan.
    second_moment = _mean(applied.square()).clamp(min=torch.finfo(torch.float64).tiny)
    metrics["rollout_is_eff_sample_size"] = _mean(applied).square() / second_moment
    return metrics


def _sequence_metrics(seq_weights: Tensor, upper: float, lower: float) -> Metrics:
    mean = _mean(seq_weights)
    return {
        "rollout_is_seq_mean": mean,
        "rollout_is_seq_std": _mean((seq_weights - mean).square()).sqrt(),
        "rollout_is_seq_min": _min(seq_weights),
        "rollout_is_seq_max": _max(seq_weights),
        "rollout_is_seq_max_deviation": _max((seq_weights - 1).abs()),
        "rollout_is_seq_fraction_high": _mean((seq_weights > upper).double()),
        "rollout_is_seq_fraction_low": _mean((seq_weights < lower).double()),
    }


def _mean(x: Tensor) -> Tensor:
    return x.sum() / max(x.numel(), 1)


def _max(x: Tensor) -> Tensor:
    return x.max() if x.numel() else x.new_zeros(())


def _min(x: Tensor) -> Tensor:
    return x.min() if x.numel() else x.new_zeros(())


def _quantiles(x: Tensor, qs: list[float]) -> list[Tensor]:
    """Linear-interpolation quantiles (numpy's default) without ``torch.quantile``'s size cap."""
    if x.numel() == 0:
        return [x.new_zeros(()) for _ in qs]
    ordered = x.sort().values
    result = []
    for q in qs:
        pos = q * (ordered.numel() - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, ordered.numel() - 1)
        result.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return result
