"""RL algorithms on plain torch tensors: advantages, policy losses, KL, DAPO, rollout IS.

Depends on torch (and pydantic for :class:`AlgorithmConfig`) only. Tensors are
``[B, T]`` over response tokens with a ``response_mask`` (1 = model token), plus
``[B]`` per-sequence values and a per-row group key for the group estimators.

The names below load lazily, on first use: importing ``agentrl.algos.config`` (pure
pydantic, mounted by the config tree) loads no torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.algos.advantages import (
        AdvantageEstimator,
        AdvantageInputs,
        Advantages,
        compute_advantages,
        get_adv_estimator,
        register_adv_estimator,
        scores_to_token_rewards,
        turn_returns,
    )
    from agentrl.algos.config import (
        AlgorithmConfig,
        DynamicSamplingConfig,
        KLConfig,
        OverlongConfig,
        PolicyLossConfig,
    )
    from agentrl.algos.dapo import (
        DynamicSampler,
        DynamicSamplingError,
        filter_groups,
        overlong_penalty,
    )
    from agentrl.algos.kl import (
        AdaptiveKLController,
        FixedKLController,
        KLController,
        apply_kl_penalty,
        entropy_bonus,
        entropy_from_logits,
        kl_estimate,
        kl_loss,
    )
    from agentrl.algos.loss_agg import LOSS_AGG_MODES, agg_loss
    from agentrl.algos.ops import Metrics, masked_mean, masked_sum, masked_whiten
    from agentrl.algos.policy_losses import (
        PolicyLossFn,
        PolicyLossOutput,
        get_policy_loss,
        register_policy_loss,
    )
    from agentrl.algos.rollout_is import (
        RolloutIS,
        compute_mismatch_metrics,
        compute_rollout_is_weights,
    )
    from agentrl.algos.value_loss import ValueLossOutput, value_loss

_EXPORTS = {
    "AdvantageEstimator": "agentrl.algos.advantages",
    "AdvantageInputs": "agentrl.algos.advantages",
    "Advantages": "agentrl.algos.advantages",
    "compute_advantages": "agentrl.algos.advantages",
    "get_adv_estimator": "agentrl.algos.advantages",
    "register_adv_estimator": "agentrl.algos.advantages",
    "scores_to_token_rewards": "agentrl.algos.advantages",
    "turn_returns": "agentrl.algos.advantages",
    "AlgorithmConfig": "agentrl.algos.config",
    "DynamicSamplingConfig": "agentrl.algos.config",
    "KLConfig": "agentrl.algos.config",
    "OverlongConfig": "agentrl.algos.config",
    "PolicyLossConfig": "agentrl.algos.config",
    "DynamicSampler": "agentrl.algos.dapo",
    "DynamicSamplingError": "agentrl.algos.dapo",
    "filter_groups": "agentrl.algos.dapo",
    "overlong_penalty": "agentrl.algos.dapo",
    "AdaptiveKLController": "agentrl.algos.kl",
    "FixedKLController": "agentrl.algos.kl",
    "KLController": "agentrl.algos.kl",
    "apply_kl_penalty": "agentrl.algos.kl",
    "entropy_bonus": "agentrl.algos.kl",
    "entropy_from_logits": "agentrl.algos.kl",
    "kl_estimate": "agentrl.algos.kl",
    "kl_loss": "agentrl.algos.kl",
    "LOSS_AGG_MODES": "agentrl.algos.loss_agg",
    "agg_loss": "agentrl.algos.loss_agg",
    "Metrics": "agentrl.algos.ops",
    "masked_mean": "agentrl.algos.ops",
    "masked_sum": "agentrl.algos.ops",
    "masked_whiten": "agentrl.algos.ops",
    "PolicyLossFn": "agentrl.algos.policy_losses",
    "PolicyLossOutput": "agentrl.algos.policy_losses",
    "get_policy_loss": "agentrl.algos.policy_losses",
    "register_policy_loss": "agentrl.algos.policy_losses",
    "RolloutIS": "agentrl.algos.rollout_is",
    "compute_mismatch_metrics": "agentrl.algos.rollout_is",
    "compute_rollout_is_weights": "agentrl.algos.rollout_is",
    "ValueLossOutput": "agentrl.algos.value_loss",
    "value_loss": "agentrl.algos.value_loss",
}

__all__ = [
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "Advantages",
    "AlgorithmConfig",
    "DynamicSampler",
    "DynamicSamplingConfig",
    "DynamicSamplingError",
    "FixedKLController",
    "KLConfig",
    "KLController",
    "Metrics",
    "OverlongConfig",
    "PolicyLossConfig",
    "PolicyLossFn",
    "PolicyLossOutput",
    "RolloutIS",
    "ValueLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantages",
    "compute_mismatch_metrics",
    "compute_rollout_is_weights",
    "entropy_bonus",
    "entropy_from_logits",
    "filter_groups",
    "get_adv_estimator",
    "get_policy_loss",
    "kl_estimate",
    "kl_loss",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "overlong_penalty",
    "register_adv_estimator",
    "register_policy_loss",
    "scores_to_token_rewards",
    "turn_returns",
    "value_loss",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """``agentrl.algos.value_loss`` is the function, as it was when this package imported
    its names eagerly: importing the submodule of the same name (which sets it as an
    attribute of the package) sets the function instead."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "value_loss" and isinstance(value, types.ModuleType):
            value = value.value_loss
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
