"""Advantage estimators and their registry.

Every estimator maps :class:`AdvantageInputs` and the :class:`AlgorithmConfig` to
``Advantages(advantages, returns)``, both ``[B, T]`` and zero where
``response_mask`` is 0. Conventions shared by all of them:

- Rewards count only on tokens with ``response_mask`` 1 (model tokens); put the
  outcome on the last model token with :func:`scores_to_token_rewards`.
- The sequence score is ``s_i = Σ_t r_it m_it``.
- Tool and user tokens inside a response (mask 0) are not decisions: discounting
  and bootstrapping skip over them, so ``γ`` applies once per model token.
- A group holding a single sample has baseline 0 and scale 1 (its raw score is the
  advantage), as in verl, so that singleton groups still carry their reward.

GRPO, Dr.GRPO and RLOO assign credit as ``cfg.credit`` says: ``broadcast`` gives every
model token of a response its sequence advantage; ``per_turn`` gives each model turn
(``turn_index``) the advantage of its discounted return ``G_k`` (:func:`turn_returns`),
against the baseline and scale the group's ``G_0`` give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algos.config import AlgorithmConfig
from agentrl.algos.ops import GroupIndex, group_ids, group_sum, masked_sum, masked_whiten

GRPO_EPS = 1e-6


@dataclass(frozen=True)
class AdvantageInputs:
    """What the estimators read; each needs only some of the optional fields."""

    token_level_rewards: Tensor
    """``[B, T]`` rewards (outcome on the last model token, minus any in-reward KL)."""
    response_mask: Tensor
    """``[B, T]`` 1 on model-generated tokens, 0 on tool/user tokens and padding."""
    index: GroupIndex | None = None
    """``[B]`` group key (prompt uid) per row: GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, OPO."""
    values: Tensor | None = None
    """``[B, T]`` critic values: GAE."""
    reward_baselines: Tensor | None = None
    """``[B]`` reward of the greedy response to the same prompt: ReMax."""
    turn_index: Tensor | None = None
    """``[B, T]`` the model turn (0, 1, ...) of each model token, for ``credit: per_turn``
    (read where ``response_mask`` is 1); None = every response is one turn."""

    @property
    def scores(self) -> Tensor:
        """``[B]`` sequence scores ``Σ_t r_t m_t``."""
        return masked_sum(self.token_level_rewards, self.response_mask, dim=-1)


class Advantages(NamedTuple):
    advantages: Tensor
    returns: Tensor


AdvantageEstimator = Callable[[AdvantageInputs, AlgorithmConfig], Advantages]

_REGISTRY: dict[str, AdvantageEstimator] = {}


def register_adv_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an estimator available as ``algorithm.adv_estimator=name``."""

    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return register


def registered_adv_estimators() -> list[str]:
    """The names of the registered advantage estimators (agentrl's and the plugins')."""
    return sorted(_REGISTRY)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {sorted(_REGISTRY)}"
        ) from None


def compute_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """Check the input shapes and run the estimator named by ``cfg.adv_estimator``."""
    estimator = get_adv_estimator(cfg.adv_estimator)
    rewards, mask = inputs.token_level_rewards, inputs.response_mask
    if rewards.dim() != 2 or rewards.shape != mask.shape:
        raise ValueError(
            f"token_level_rewards {tuple(rewards.shape)} and response_mask "
            f"{tuple(mask.shape)} must both be [B, T]"
        )
    if inputs.values is not None and inputs.values.shape != rewards.shape:
        raise ValueError(f"values {tuple(inputs.values.shape)} must be {tuple(rewards.shape)}")
    if inputs.turn_index is not None and inputs.turn_index.shape != rewards.shape:
        raise ValueError(
            f"turn_index {tuple(inputs.turn_index.shape)} must be {tuple(rewards.shape)}"
        )
    if inputs.index is not None and len(inputs.index) != rewards.shape[0]:
        raise ValueError(f"index has {len(inputs.index)} entries for {rewards.shape[0]} rows")
    return estimator(inputs, cfg)


def scores_to_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, T]`` rewards holding ``scores[i]`` on the last model token of row ``i``.

    A row without any model token gets no reward.
    """
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask, positions, -1).amax(dim=-1)
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows]
    return rewards


def _require(value: object, field: str, estimator: str) -> None:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs `{field}`, got None")


def _broadcast(seq_values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), seq_values.unsqueeze(-1), 0.0)


def _group_stats(scores: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row group ``(ids, count, mean, unbiased std)``; std is 0 for singletons."""
    ids, num_groups = group_ids(index, device=scores.device)
    count = group_sum(torch.ones_like(scores), ids, num_groups)[ids]
    mean = group_sum(scores, ids, num_groups)[ids] / count
    sq_dev = group_sum((scores - mean).square(), ids, num_groups)[ids]
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    return ids, count, mean, std


@register_adv_estimator("gae")
@torch.no_grad()
def gae(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """Generalised advantage estimation (Schulman et al., 2016) over model tokens.

    ``δ_t = r_t + γ V_{t'} - V_t`` and ``Â_t = δ_t + γλ Â_{t'}``, where ``t'`` is the
    next model token (``V = Â = 0`` past the last). Returns ``R_t = Â_t + V_t``; the
    advantages are whitened over all model tokens of the batch.
    """
    _require(inputs.values, "values", "gae")
    values, rewards = inputs.values, inputs.token_level_rewards
    mask = inputs.response_mask.bool()
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + cfg.gamma * next_value - values[:, t]
        next_adv = torch.where(mask[:, t], delta + cfg.gamma * cfg.lam * next_adv, next_adv)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        adv[:, t] = next_adv
    returns = torch.where(mask, adv + values, 0.0)
    return Advantages(masked_whiten(adv, mask), returns)


def turn_returns(
    token_level_rewards: Tensor, response_mask: Tensor, turn_index: Tensor | None, gamma: float
) -> tuple[Tensor, Tensor]:
    """Per-turn discounted returns: ``([B, T]`` the return of each model token's turn,
    ``[B]`` the return from the first turn ``G_0)``.

    ``R_k = Σ_{t in turn k} r_t m_t`` and ``G_k = Σ_{k' ≥ k} γ^(k'-k) R_k'``; a row
    without model tokens has ``G_0 = 0``. ``turn_index`` None makes each row one turn.
    """
    mask = response_mask.bool()
    turns = torch.zeros_like(mask, dtype=torch.long) if turn_index is None else turn_index
    turns = torch.where(mask, turns.long(), 0)
    num_turns = int(turns.max()) + 1 if turns.numel() else 1
    rewards = torch.where(mask, token_level_rewards, 0.0)
    per_turn = torch.zeros(
        (rewards.shape[0], num_turns), dtype=rewards.dtype, device=rewards.device
    ).scatter_add_(1, turns, rewards)
    k = torch.arange(num_turns, device=rewards.device)
    steps = k.unsqueeze(1) - k.unsqueeze(0)  # [k', k] = k' - k
    discount = torch.where(
        steps >= 0,
        torch.tensor(gamma, dtype=rewards.dtype, device=rewards.device).pow(steps.clamp(min=0)),
        0.0,
    )
    returns = per_turn @ discount  # G_k = Σ_k' R_k' γ^(k'-k) [k' ≥ k]
    return torch.where(mask, returns.gather(1, turns), 0.0), returns[:, 0]


def _credit(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """``([B, T]`` the return each token is credited with, ``[B]`` the return the group
    baseline is computed from): the sequence score for ``broadcast``, the turn returns
    and ``G_0`` for ``per_turn``."""
    if cfg.credit == "per_turn":
        return turn_returns(
            inputs.token_level_rewards, inputs.response_mask, inputs.turn_index, cfg.gamma
        )
    scores = inputs.scores
    return scores.unsqueeze(-1).expand_as(inputs.token_level_rewards), scores


def _grpo(
    inputs: AdvantageInputs, cfg: AlgorithmConfig, norm_by_std: bool, name: str
) -> Advantages:
    _require(inputs.index, "index", name)
    credited, scores = _credit(inputs, cfg)
    _, count, mean, std = _group_stats(scores, inputs.index)
    single = count == 1
    adv = credited - torch.where(single, 0.0, mean).unsqueeze(-1)
    if norm_by_std:
        adv = adv / (torch.where(single, 1.0, std) + GRPO_EPS).unsqueeze(-1)
    adv = torch.where(inputs.response_mask.bool(), adv, 0.0)
    return Advantages(adv, adv)


@register_adv_estimator("grpo")
@torch.no_grad()
def grpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """GRPO (Shao et al., 2024): ``Â_i = (s_i - mean_g s) / (std_g s + ε)`` on every token.

    ``std_g`` is the unbiased group std and ``ε = 1e-6``, so a group with equal scores
    gets 0. With ``norm_adv_by_std_in_grpo=False`` the division is skipped (Dr.GRPO).
    With ``credit: per_turn``, ``s_i`` is ``G_0`` in the statistics and a token of turn
    ``k`` gets ``(G_ik - mean_g G_0) / (std_g G_0 + ε)``.
    """
    return _grpo(inputs, cfg, cfg.norm_adv_by_std_in_grpo, "grpo")


@register_adv_estimator("dr_grpo")
@torch.no_grad()
def dr_grpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """Dr.GRPO (Liu et al., 2025): ``Â_i = s_i - mean_g s``, no std normalisation.

    The paper also removes length normalisation: pair it with
    ``loss_agg_mode="seq-mean-token-sum-norm"``.
    """
    return _grpo(inputs, cfg, False, "dr_grpo")


@register_adv_estimator("rloo")
@torch.no_grad()
def rloo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """RLOO (Ahmadian et al., 2024): ``Â_i = s_i - (Σ_{j∈g, j≠i} s_j) / (n_g - 1)``.

    With ``credit: per_turn`` a token of turn ``k`` gets
    ``G_ik - (Σ_{j∈g, j≠i} G_j0) / (n_g - 1)``.
    """
    _require(inputs.index, "index", "rloo")
    credited, scores = _credit(inputs, cfg)
    _, count, mean, _ = _group_stats(scores, inputs.index)
    loo_mean = (mean * count - scores) / (count - 1).clamp(min=1)
    adv = credited - torch.where(count > 1, loo_mean, 0.0).unsqueeze(-1)
    adv = torch.where(inputs.response_mask.bool(), adv, 0.0)
    return Advantages(adv, adv)


@register_adv_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """REINFORCE++ (Hu, 2025): discounted return whitened over the batch's model tokens.

    ``G_t = r_t + γ G_{t'}`` (``t'`` the next model token) and ``Â = whiten(G)``.
    """
    rewards, mask = inputs.token_level_rewards, inputs.response_mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + cfg.gamma * running, running)
        returns[:, t] = running
    returns = torch.where(mask, returns, 0.0)
    return Advantages(masked_whiten(returns, mask), returns)


@register_adv_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """REINFORCE++-baseline: ``Â = whiten(s_i - mean_g s)`` over the batch's model tokens."""
    _require(inputs.index, "index", "reinforce_plus_plus_baseline")
    scores = inputs.scores
    _, count, mean, _ = _group_stats(scores, inputs.index)
    centered = _broadcast(scores - torch.where(count == 1, 0.0, mean), inputs.response_mask)
    adv = masked_whiten(centered, inputs.response_mask)
    return Advantages(adv, adv)


@register_adv_estimator("remax")
@torch.no_grad()
def remax(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """ReMax (Li et al., 2023): ``G_t = Σ_{k≥t} r_k`` and ``Â_t = G_t - b``.

    ``b`` is ``reward_baselines``: the reward of the greedy response to the same prompt.
    """
    _require(inputs.reward_baselines, "reward_baselines", "remax")
    mask = inputs.response_mask.bool()
    rewards = torch.where(mask, inputs.token_level_rewards, 0.0)
    returns = torch.where(mask, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
    adv = returns - _broadcast(inputs.reward_baselines.to(rewards.dtype), mask)
    return Advantages(adv, returns)


@register_adv_estimator("opo")
@torch.no_grad()
def opo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> Advantages:
    """OPO (Hao et al., 2025): length-weighted baseline ``b_g = Σ l_j s_j / Σ l_j``.

    ``l_j`` is the number of model tokens of response ``j``; ``Â_i = s_i - b_g``.
    """
    _require(inputs.index, "index", "opo")
    scores = inputs.scores
    lengths = inputs.response_mask.bool().sum(-1).to(scores.dtype)
    ids, num_groups = group_ids(inputs.index, device=scores.device)
    count = group_sum(torch.ones_like(scores), ids, num_groups)[ids]
    total_len = group_sum(lengths, ids, num_groups)[ids]
    baseline = group_sum(lengths * scores, ids, num_groups)[ids] / total_len.clamp(min=1)
    adv = _broadcast(scores - torch.where(count > 1, baseline, 0.0), inputs.response_mask)
    return Advantages(adv, adv)
