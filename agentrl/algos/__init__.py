"""RL algorithms on plain torch tensors: advantages, policy losses, KL, DAPO, rollout IS.

Depends on torch (and pydantic for :class:`AlgorithmConfig`) only. Tensors are
``[B, T]`` over response tokens with a ``response_mask`` (1 = model token), plus
``[B]`` per-sequence values and a per-row group key for the group estimators.
"""

from agentrl.algos.advantages import (
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    compute_advantages,
    get_adv_estimator,
    register_adv_estimator,
    scores_to_token_rewards,
)
from agentrl.algos.config import (
    AlgorithmConfig,
    DynamicSamplingConfig,
    KLConfig,
    OverlongConfig,
    PolicyLossConfig,
)
from agentrl.algos.dapo import DynamicSampler, DynamicSamplingError, filter_groups, overlong_penalty
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
    "value_loss",
]
