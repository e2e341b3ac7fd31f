"""Policy-gradient losses and their registry.

Every loss has the signature of :class:`PolicyLossFn`: it builds a per-token loss
matrix ``L [B, T]``, multiplies it by ``rollout_is_weights`` when given (rollout
importance sampling, see :mod:`agentrl.algos.rollout_is`), and reduces it with
``cfg.loss_agg_mode``. With ``ρ_t = π(a_t)/π_old(a_t)`` and ``A_t`` the advantage.
Log-ratios are clamped to ±20 before ``exp``, so extreme ratios give finite
losses and gradients.

Metrics (detached 0-dim tensors, token means over the mask): ``ppo_kl``
(``mean(log π_old - log π)``), ``clipfrac`` (tokens whose clip bound is the active
term) and ``clipfrac_lower`` (tokens where the dual-clip bound is active; 0 for the
losses without dual-clip). Clip-Cov and KL-Cov add ``clip_cov_frac`` and
``kl_cov_frac``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from agentrl.algos.config import PolicyLossConfig
from agentrl.algos.loss_agg import agg_loss
from agentrl.algos.ops import Metrics, masked_count, masked_mean

LOG_RATIO_BOUND = 20.0


class PolicyLossOutput(NamedTuple):
    loss: Tensor
    metrics: Metrics


class PolicyLossFn(Protocol):
    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        cfg: PolicyLossConfig,
        *,
        rollout_is_weights: Tensor | None = None,
        denominator: float | Tensor | None = None,
    ) -> PolicyLossOutput: ...


_REGISTRY: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: make a loss available as ``algorithm.policy_loss.loss_mode=name``."""

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return register


def registered_policy_losses() -> list[str]:
    """The names of the registered policy losses (agentrl's and the plugins')."""
    return sorted(_REGISTRY)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; registered: {sorted(_REGISTRY)}") from None


def _log_ratio(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _frac(flags: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(flags.detach().float(), mask)


def _finish(
    pg_losses: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    rollout_is_weights: Tensor | None,
    denominator: float | Tensor | None,
    metrics: Metrics,
) -> PolicyLossOutput:
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(
        pg_losses,
        response_mask,
        cfg.loss_agg_mode,
        norm_constant=cfg.loss_agg_norm_constant,
        denominator=denominator,
    )
    return PolicyLossOutput(loss, {k: v.detach() for k, v in metrics.items()})


@register_policy_loss("vanilla")
def ppo_clip_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clip with asymmetric bounds (DAPO clip-higher) and dual-clip.

    ``L_t = max(-A ρ, -A clip(ρ, 1-ε_low, 1+ε_high))``; for ``A < 0`` it is further
    capped at ``-A·c`` (dual-clip, Ye et al., 2020) so a huge ratio cannot blow up
    the loss of a bad action.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * cfg.clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, response_mask),
        "clipfrac": _frac(loss_clipped > loss_unclipped, response_mask),
        "clipfrac_lower": _frac(negative & (loss_ppo > loss_dual), response_mask),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("gspo")
def gspo_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """GSPO (Zheng et al., 2025): a sequence-level ratio, clipped like PPO.

    ``s_i = exp(mean_t log ρ_it)`` (the geometric mean of the token ratios). Each
    token uses ``s_it = sg(s_i) · π(a_t) / sg(π(a_t))``: its value is ``s_i`` and its
    gradient ``s_i ∇log π(a_t)``. ``L_t = max(-A s_it, -A clip(s_it, 1-ε_low, 1+ε_high))``.
    The paper reduces with ``seq-mean-token-mean`` and ε of a few 1e-4.
    """
    token_log_ratio = torch.where(response_mask.bool(), log_prob - old_log_prob, 0.0)
    seq_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = log_seq_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {
        "ppo_kl": masked_mean(-token_log_ratio, response_mask),
        "clipfrac": _frac(loss_clipped > loss_unclipped, response_mask),
        "clipfrac_lower": log_prob.new_zeros(()),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("gpg")
def gpg_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """GPG (Chu et al., 2025): plain policy gradient ``L_t = -A_t log π(a_t)``, no ratio."""
    pg_losses = -advantages * log_prob
    metrics = {
        "ppo_kl": masked_mean(old_log_prob - log_prob, response_mask),
        "clipfrac": log_prob.new_zeros(()),
        "clipfrac_lower": log_prob.new_zeros(()),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("clip_cov")
def clip_cov_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """Clip-Cov (Cui et al., 2025): cut the gradient of a few high-covariance tokens.

    ``cov_t = (A_t - mean A)(log π_t - mean log π)`` over the unmasked tokens. Among
    tokens not already clipped by PPO with ``clip_cov_lb < cov_t < clip_cov_ub``,
    ``max(⌊clip_cov_ratio · N⌋, 1)`` are drawn uniformly at random (torch's global
    RNG) and their loss is zeroed; the rest use the PPO clip loss (no dual-clip).
    """
    valid = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    ppo_clipped = loss_clipped > loss_unclipped
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, valid)) * (
            log_prob - masked_mean(log_prob, valid)
        )
        candidates = valid & ~ppo_clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
        flat = torch.nonzero(candidates.flatten()).squeeze(-1)
        num_cut = max(int(cfg.clip_cov_ratio * int(masked_count(valid))), 1)
        chosen = flat[torch.randperm(flat.numel(), device=flat.device)[:num_cut]]
        cut = torch.zeros_like(valid).flatten().index_fill_(0, chosen, True).view_as(valid)
    pg_losses = torch.where(cut, 0.0, torch.maximum(loss_unclipped, loss_clipped))
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, valid),
        "clipfrac": _frac(ppo_clipped, valid),
        "clipfrac_lower": log_prob.new_zeros(()),
        "clip_cov_frac": _frac(cut, valid),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("kl_cov")
def kl_cov_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """KL-Cov (Cui et al., 2025): a KL penalty on the highest-covariance tokens.

    ``L_t = -A_t ρ_t``, plus ``ppo_kl_coef · |log ρ_t|`` on the
    ``max(⌊kl_cov_ratio · N⌋, 1)`` unmasked tokens with the largest
    ``cov_t = (A_t - mean A)(log π_t - mean log π)`` (none when ``kl_cov_ratio`` is 0).
    """
    valid = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    pg_losses = -advantages * log_ratio.exp()
    with torch.no_grad():
        flat = torch.nonzero(valid.flatten()).squeeze(-1)
        adv = advantages.flatten()[flat]
        logp = log_prob.detach().flatten()[flat]
        cov = (adv - adv.mean()) * (logp - logp.mean())
        num_penalised = max(int(cfg.kl_cov_ratio * flat.numel()), 1)
        if cfg.kl_cov_ratio == 0 or flat.numel() == 0:
            num_penalised = 0
        top = flat[torch.topk(cov, num_penalised).indices]
        penalised = torch.zeros_like(valid).flatten().index_fill_(0, top, True).view_as(valid)
    pg_losses = pg_losses + torch.where(penalised, cfg.ppo_kl_coef * log_ratio.abs(), 0.0)
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, valid),
        "clipfrac": log_prob.new_zeros(()),
        "clipfrac_lower": log_prob.new_zeros(()),
        "kl_cov_frac": _frac(penalised, valid),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("geo_mean")
def geo_mean_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """GMPO (Zhao et al., 2025): PPO on the geometric mean of the token ratios.

    With ``Ā_i`` the token-mean advantage of row ``i``, each token's log-ratio is
    clipped to ``[-ε_low, ε_high]`` on the pessimistic side for ``sign(Ā_i)``:
    ``ℓ_t = sign(Ā)·min(sign(Ā) log ρ_t, sign(Ā) clip(log ρ_t))``. The sequence loss is
    ``-Ā_i exp(mean_t ℓ_t)``; every token of the row carries it, so with
    ``seq-mean-token-mean`` the loss is the mean of the sequence losses.
    """
    valid = response_mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob)
    seq_adv = masked_mean(advantages, valid, dim=-1)
    sign = torch.where(seq_adv < 0, -1.0, 1.0).unsqueeze(-1)
    clipped = log_ratio.clamp(-cfg.clip_low, cfg.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    seq_ratio = masked_mean(pessimistic, valid, dim=-1).exp()
    pg_losses = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, valid),
        "clipfrac": _frac(pessimistic != log_ratio, valid),
        "clipfrac_lower": log_prob.new_zeros(()),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)


@register_policy_loss("cispo")
def cispo_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: PolicyLossConfig,
    *,
    rollout_is_weights: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, 2025): clip the IS weight, never the gradient.

    ``L_t = -sg(clip(ρ_t, 1-ε_low, 1+ε_high)) · A_t · log π(a_t)``: every token keeps
    a gradient, scaled by its clipped (stop-gradient) ratio.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    pg_losses = -clipped.detach() * advantages * log_prob
    metrics = {
        "ppo_kl": masked_mean(-log_ratio, response_mask),
        "clipfrac": _frac(clipped != ratio, response_mask),
        "clipfrac_lower": log_prob.new_zeros(()),
    }
    return _finish(pg_losses, response_mask, cfg, rollout_is_weights, denominator, metrics)
