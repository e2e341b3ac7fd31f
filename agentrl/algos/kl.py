"""KL estimators, the KL penalty in the reward and the KL loss; entropy from logits."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from agentrl.algos.config import KLEstimator, LossAggMode
from agentrl.algos.loss_agg import agg_loss
from agentrl.algos.ops import Metrics, masked_count, masked_mean

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
_K3_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


def kl_estimate(log_prob: Tensor, ref_log_prob: Tensor, kind: KLEstimator) -> Tensor:
    """Per-token estimate of KL(π‖π_ref) from samples of π, with ``d = log π - log π_ref``.

    - ``k1`` (``kl``): ``d``, unbiased, high variance, can be negative;
    - ``abs``: ``|d|``;
    - ``k2`` (``mse``): ``d² / 2``;
    - ``k3`` (``low_var_kl``): ``e^{-d} + d - 1 ≥ 0``, unbiased and low variance
      (Schulman, "Approximating KL divergence"). ``d`` is clamped to ±20 before the
      exponential and the estimate capped at 10, so extreme ratios cannot overflow.
    """
    name = _ALIASES.get(kind, kind)
    diff = log_prob - ref_log_prob
    if name == "k1":
        return diff
    if name == "abs":
        return diff.abs()
    if name == "k2":
        return 0.5 * diff.square()
    if name == "k3":
        neg = (-diff).clamp(-_K3_LOG_RATIO_BOUND, _K3_LOG_RATIO_BOUND)
        return (neg.exp() - neg - 1).clamp(max=_K3_BOUND)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of k1, abs, k2, k3")


class KLController(Protocol):
    """Holds the in-reward KL coefficient β and adapts it to the observed KL."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint keeps of the controller (empty when the config says it all)."""
        ...

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore what ``state_dict`` returned."""
        ...


class FixedKLController:
    """Constant β."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: β stays fixed."""

    def state_dict(self) -> dict[str, float]:
        """Nothing: β is the config's ``kl_coef`` (a resumed run may set a new one)."""
        return {}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Nothing to restore."""


class AdaptiveKLController:
    """Proportional β controller (Ziegler et al., 2019).

    ``e = clip(KL / target - 1, -0.2, 0.2)`` and ``β ← β · (1 + e · n_steps / horizon)``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β towards the value that keeps the KL at the target."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """β as adapted so far."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue from a saved β (a state without one leaves β as it is)."""
        self.value = float(state.get("value", self.value))


def apply_kl_penalty(
    token_level_scores: Tensor,
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    controller: KLController,
    kind: KLEstimator = "k1",
) -> tuple[Tensor, Metrics]:
    """Token-level rewards ``r_t = s_t - β · KL_t · m_t`` and the controller step.

    ``KL_t`` is :func:`kl_estimate` of the rollout policy against the reference. The
    batch KL fed to ``controller.update`` (with ``n_steps = B``) is the mean over
    non-empty rows of each row's token-mean KL. Metrics: ``kl_penalty`` (that KL) and
    ``kl_coef`` (the β used for this batch, before the update).
    """
    kld = kl_estimate(log_prob, ref_log_prob, kind).detach()
    beta = controller.value
    rewards = token_level_scores - beta * torch.where(response_mask.bool(), kld, 0.0)
    row_kl = masked_mean(kld, response_mask, dim=-1)
    current_kl = masked_mean(row_kl, masked_count(response_mask, dim=-1) > 0)
    controller.update(float(current_kl), n_steps=token_level_scores.shape[0])
    metrics = {"kl_penalty": current_kl, "kl_coef": kld.new_tensor(beta)}
    return rewards, metrics


def kl_loss(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kind: KLEstimator = "k3",
    loss_agg_mode: LossAggMode = "token-mean",
    *,
    norm_constant: float | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """``agg(KL_t)``: the KL-to-reference loss term (multiply by ``kl_loss_coef``)."""
    kld = kl_estimate(log_prob, ref_log_prob, kind)
    return agg_loss(
        kld, response_mask, loss_agg_mode, norm_constant=norm_constant, denominator=denominator
    )


def entropy_from_logits(logits: Tensor, log_z: Tensor | None = None) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim: ``logsumexp(z) - Σ_v p_v z_v``.

    ``log_z``: ``logsumexp(logits, -1)`` where the caller has it already (the log-prob
    computation does), so it is not computed twice."""
    if log_z is None:
        log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def entropy_bonus(
    entropy: Tensor,
    response_mask: Tensor,
    coef: float,
    loss_agg_mode: LossAggMode = "token-mean",
    *,
    norm_constant: float | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """``-coef · agg(H_t)``: the term to add to the loss to reward entropy."""
    return -coef * agg_loss(
        entropy, response_mask, loss_agg_mode, norm_constant=norm_constant, denominator=denominator
    )
