"""The actor loss handed to ``ActorGroup.update_actor``, assembled from ``agentrl.algos``.

loss = policy loss (the configured ``loss_mode``, rollout-IS weights applied per token)
       + kl_loss_coef · KL(π ‖ π_ref)        if ``use_kl_loss``
       − entropy_coeff · entropy             if ``entropy_coeff > 0``

Each term is normalised by the mini-batch's global token or sequence count, as the
worker's micro-batching requires. Metric names carry no prefix: the worker adds ``actor/``.
"""

from __future__ import annotations

from torch import Tensor

from agentrl.algos import (
    AlgorithmConfig,
    agg_loss,
    entropy_bonus,
    get_policy_loss,
    kl_loss,
    value_loss,
)
from agentrl.trainer.micro_batch import Metrics, MicroBatch, PolicyLossFn, ValueLossFn


def _denominator(mode: str, micro_batch: MicroBatch) -> int:
    if mode == "token-mean":
        return micro_batch.global_num_tokens
    return micro_batch.global_num_seqs


def make_actor_loss(cfg: AlgorithmConfig) -> PolicyLossFn:
    """The ``loss_fn(log_probs, entropy, micro_batch)`` for this algorithm config."""
    policy_loss = get_policy_loss(cfg.policy_loss.loss_mode)
    mode = cfg.policy_loss.loss_agg_mode
    norm = cfg.policy_loss.loss_agg_norm_constant

    def loss_fn(
        log_probs: Tensor, entropy: Tensor | None, micro_batch: MicroBatch
    ) -> tuple[Tensor, Metrics]:
        mask = micro_batch["response_mask"]
        denominator = _denominator(mode, micro_batch)
        advantages = micro_batch["advantages"]
        if "sample_weight" in micro_batch:
            advantages = advantages * micro_batch["sample_weight"].unsqueeze(-1)
        out = policy_loss(
            micro_batch["old_log_probs"],
            log_probs,
            advantages,
            mask,
            cfg.policy_loss,
            rollout_is_weights=micro_batch.get("rollout_is_weights"),
            denominator=denominator,
        )
        loss = out.loss
        metrics: dict[str, float | Tensor] = dict(out.metrics)
        metrics["pg_loss"] = out.loss.detach()
        if cfg.kl.use_kl_loss:
            kl = kl_loss(
                log_probs,
                micro_batch["ref_log_probs"],
                mask,
                cfg.kl.kl_loss_type,
                mode,
                norm_constant=norm,
                denominator=denominator,
            )
            loss = loss + cfg.kl.kl_loss_coef * kl
            metrics["kl_loss"] = kl.detach()
        if entropy is not None:
            ent = agg_loss(entropy, mask, mode, norm_constant=norm, denominator=denominator)
            metrics["entropy"] = ent.detach()
            if cfg.kl.entropy_coeff > 0:
                loss = loss + entropy_bonus(
                    entropy,
                    mask,
                    cfg.kl.entropy_coeff,
                    mode,
                    norm_constant=norm,
                    denominator=denominator,
                )
        return loss, metrics

    return loss_fn


def make_critic_loss(cfg: AlgorithmConfig) -> ValueLossFn:
    """The clipped value loss ``loss_fn(values, micro_batch)`` for ``update_critic``."""
    mode = cfg.policy_loss.loss_agg_mode

    def loss_fn(values: Tensor, micro_batch: MicroBatch) -> tuple[Tensor, Metrics]:
        out = value_loss(
            values,
            micro_batch["values"],
            micro_batch["returns"],
            micro_batch["response_mask"],
            cfg.value_clip,
            mode,
            norm_constant=cfg.policy_loss.loss_agg_norm_constant,
            denominator=_denominator(mode, micro_batch),
        )
        return out.loss, {"value_loss": out.loss.detach(), **out.metrics}

    return loss_fn
