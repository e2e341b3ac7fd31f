"""The ``algorithm`` section of the config tree: advantages, losses, KL, DAPO, rollout IS.

Defined here (not in ``agentrl.config``) so that ``agentrl.algos`` depends on torch,
pydantic and the config base of ``agentrl.core`` alone; the root config mounts
:class:`AlgorithmConfig` as ``algorithm``. This module loads no torch: the CLI validates
a config (and names the built-in estimators and losses) without it. The value types the
torch modules share with the config (``KLEstimator``, ``LossAggMode``, the rollout IS
level and mode) are defined here and re-exported there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from agentrl.core.config import Section

if TYPE_CHECKING:
    from agentrl.algos.kl import KLController

KLEstimator = Literal["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"]
LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
RolloutISLevel = Literal["token", "sequence", "geometric"]
RolloutISMode = Literal["truncate", "mask"]
CreditAssignment = Literal["broadcast", "per_turn"]

PER_TURN_ADV_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")
"""The estimators ``credit: per_turn`` works with (group baselines over episodes)."""

BUILTIN_ADV_ESTIMATORS: tuple[str, ...] = (
    "gae",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
)
"""The advantage estimators ``agentrl.algos.advantages`` registers (a plugin adds more)."""

BUILTIN_POLICY_LOSSES: tuple[str, ...] = (
    "vanilla",
    "gspo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "cispo",
)
"""The policy losses ``agentrl.algos.policy_losses`` registers (a plugin adds more)."""


def resolve_is_thresholds(threshold: float, threshold_lower: float | None) -> tuple[float, float]:
    """``(upper, lower)`` with ``lower = 1 / upper`` by default; checks ``0 ≤ lower ≤ upper``."""
    if not threshold > 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {threshold}")
    lower = 1.0 / threshold if threshold_lower is None else threshold_lower
    if not 0 <= lower <= threshold:
        raise ValueError(
            f"rollout IS lower threshold {lower} must lie in [0, {threshold}] (the upper "
            "threshold); with the default lower = 1/upper, rollout_is_threshold must be ≥ 1"
        )
    return threshold, lower


class PolicyLossConfig(Section):
    """How the policy-gradient loss is formed and reduced."""

    loss_mode: str = Field(
        "vanilla",
        description="Registered policy loss: `vanilla` (PPO clip, dual-clip), `gspo`, `gpg`, "
        "`clip_cov`, `kl_cov`, `geo_mean` (GMPO) or `cispo`.",
    )
    loss_agg_mode: LossAggMode = Field(
        "token-mean",
        description="Reduction of the per-token loss: `token-mean`, `seq-mean-token-sum`, "
        "`seq-mean-token-mean` or `seq-mean-token-sum-norm` (Dr.GRPO).",
    )
    loss_agg_norm_constant: float | None = Field(
        None,
        gt=0,
        description="Divisor of `seq-mean-token-sum-norm` (e.g. the max response length); "
        "None = the padded response length of the batch.",
    )
    clip_ratio: float = Field(0.2, ge=0, description="PPO clip ε, for both sides unless set.")
    clip_ratio_low: float | None = Field(
        None, ge=0, description="Lower clip ε_low (ratio ≥ 1 - ε_low); None = clip_ratio."
    )
    clip_ratio_high: float | None = Field(
        None,
        ge=0,
        description="Upper clip ε_high (ratio ≤ 1 + ε_high; DAPO clip-higher uses 0.28); "
        "None = clip_ratio.",
    )
    clip_ratio_c: float = Field(
        3.0, gt=1, description="Dual-clip bound c: the loss of a negative-advantage token ≤ -A·c."
    )
    clip_cov_ratio: float = Field(
        2e-4, ge=0, le=1, description="Clip-Cov: fraction of tokens whose gradient is cut."
    )
    clip_cov_lb: float = Field(1.0, description="Clip-Cov: lower covariance bound of candidates.")
    clip_cov_ub: float = Field(5.0, description="Clip-Cov: upper covariance bound of candidates.")
    kl_cov_ratio: float = Field(
        2e-4, ge=0, le=1, description="KL-Cov: fraction of tokens given the KL penalty."
    )
    ppo_kl_coef: float = Field(
        1.0, ge=0, description="KL-Cov: coefficient of |log ratio| on the selected tokens."
    )

    @property
    def clip_low(self) -> float:
        """ε_low, falling back to ``clip_ratio``."""
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        """ε_high, falling back to ``clip_ratio``."""
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class KLConfig(Section):
    """KL to the reference policy (in the reward or as a loss) and the entropy bonus."""

    use_kl_in_reward: bool = Field(
        False, description="Subtract β·KL(π_old‖π_ref) per token from the token-level rewards."
    )
    kl_penalty: KLEstimator = Field(
        "k1", description="Estimator of the in-reward KL: k1, abs, k2 (mse) or k3 (low_var_kl)."
    )
    kl_ctrl_type: Literal["fixed", "adaptive"] = Field(
        "fixed", description="In-reward β controller: `fixed` or `adaptive` (Ziegler et al.)."
    )
    kl_coef: float = Field(0.001, ge=0, description="Initial (or fixed) in-reward KL β.")
    target_kl: float = Field(0.1, gt=0, description="Adaptive controller: target KL.")
    horizon: int = Field(10_000, gt=0, description="Adaptive controller: horizon in samples.")
    use_kl_loss: bool = Field(False, description="Add kl_loss_coef·KL(π‖π_ref) to the loss.")
    kl_loss_coef: float = Field(0.001, ge=0, description="Coefficient of the KL loss.")
    kl_loss_type: KLEstimator = Field(
        "k3", description="Estimator of the KL loss: k1, abs, k2 (mse) or k3 (low_var_kl)."
    )
    entropy_coeff: float = Field(
        0.0, ge=0, description="Entropy bonus coefficient (loss -= coeff·entropy)."
    )

    def make_controller(self) -> KLController:
        """The in-reward β controller these settings describe."""
        from agentrl.algos.kl import AdaptiveKLController, FixedKLController

        if self.kl_ctrl_type == "adaptive":
            return AdaptiveKLController(self.kl_coef, self.target_kl, self.horizon)
        return FixedKLController(self.kl_coef)


class DynamicSamplingConfig(Section):
    """DAPO dynamic sampling: train only on groups whose rewards differ."""

    enable: bool = Field(False, description="Drop groups whose rewards are all equal.")
    max_num_gen_batches: int = Field(
        10,
        ge=0,
        description="Generation batches allowed to fill one train batch; after them the "
        "step trains on the groups kept so far, or skips its update with a warning if too "
        "few were kept; 0 = unbounded.",
    )


class OverlongConfig(Section):
    """DAPO soft overlong punishment."""

    enable: bool = Field(False, description="Penalise responses that run into the buffer.")
    buffer_length: int = Field(
        512, gt=0, description="Last tokens before the max response length where it ramps up."
    )
    penalty_factor: float = Field(1.0, ge=0, description="Penalty at the max response length.")


class AlgorithmConfig(Section):
    """RL algorithm knobs; the rollout IS fields keep the names of the rollout IS spec."""

    adv_estimator: str = Field(
        "grpo",
        description="Registered advantage estimator: `gae`, `grpo`, `dr_grpo`, `rloo`, "
        "`reinforce_plus_plus`, `reinforce_plus_plus_baseline`, `remax` or `opo`.",
    )
    gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Discount factor: per model token for GAE and REINFORCE++, per model "
        "turn for `credit: per_turn`.",
    )
    credit: CreditAssignment = Field(
        "broadcast",
        description="How rewards reach the tokens with `grpo`, `dr_grpo` and `rloo`: "
        "`broadcast` gives every model token the advantage of its episode's score; "
        "`per_turn` gives each model turn the advantage of its discounted return over the "
        "per-turn rewards (`extra['turn_rewards']` of the env loop) against the group's "
        "baseline.",
    )
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ.")
    value_clip: float = Field(
        0.5, gt=0, description="GAE critic: clip range of new values around the old ones."
    )
    norm_adv_by_std_in_grpo: bool = Field(
        True, description="GRPO: divide by the group std (False gives Dr.GRPO's advantage)."
    )
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    kl: KLConfig = Field(default_factory=KLConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    rollout_is_threshold: float | None = Field(
        None,
        gt=0,
        description="Rollout IS upper threshold; None switches rollout IS (weights and "
        "`mismatch/` metrics) off.",
    )
    rollout_is: bool = Field(
        False, description="Apply the rollout IS weights (False = compute the metrics only)."
    )
    rollout_is_threshold_lower: float | None = Field(
        None, ge=0, description="Rollout IS lower threshold; None = 1 / rollout_is_threshold."
    )
    rollout_is_level: RolloutISLevel = Field(
        "token", description="Rollout IS ratio: `token`, `sequence` (product) or `geometric`."
    )
    rollout_is_mode: RolloutISMode = Field(
        "truncate",
        description="`truncate` caps weights at the upper threshold; `mask` zeroes weights "
        "outside [lower, upper].",
    )
    rollout_is_veto_threshold: float | None = Field(
        1e-4,
        gt=0,
        description="Zero the weights of a sequence with any token ratio below this; "
        "None = no veto.",
    )

    @model_validator(mode="after")
    def _check_per_turn_estimator(self) -> AlgorithmConfig:
        if self.credit == "per_turn" and self.adv_estimator not in PER_TURN_ADV_ESTIMATORS:
            raise ValueError(
                f"credit: per_turn works with adv_estimator {', '.join(PER_TURN_ADV_ESTIMATORS)}"
                f"; {self.adv_estimator!r} computes its own token-level returns (use "
                "credit: broadcast)"
            )
        return self

    @model_validator(mode="after")
    def _check_rollout_is_thresholds(self) -> AlgorithmConfig:
        if self.rollout_is_threshold is not None:
            resolve_is_thresholds(self.rollout_is_threshold, self.rollout_is_threshold_lower)
        return self
