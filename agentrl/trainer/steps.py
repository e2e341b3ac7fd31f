"""The per-step building blocks the trainers compose: reward, log-probs, advantages.

Each function takes and returns plain tensors or batches so that ``Trainer.train_steps`` and
``AsyncTrainer.train_steps`` read as the algorithm: generate → reward → old log-probs →
reference → advantages → update → sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentrl.algos import (
    AdvantageInputs,
    AlgorithmConfig,
    DynamicSampler,
    KLController,
    apply_kl_penalty,
    compute_advantages,
    compute_mismatch_metrics,
    compute_rollout_is_weights,
    overlong_penalty,
    scores_to_token_rewards,
)
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import TokenOutput
from agentrl.reward.manager import RewardManager, RewardRequest
from agentrl.rollout.episode import EpisodeResult
from agentrl.rollout.metrics import episode_info, rollout_metrics
from agentrl.trainer.batch import Sample, build_batch
from agentrl.trainer.dispatch import Batch


def _decode_response(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


async def score_episodes(
    episodes: list[EpisodeResult],
    rows: dict[str, dict[str, Any]],
    rewards: RewardManager,
    tokenizer: Any,
) -> tuple[list[Sample], dict[str, float]]:
    """Reward every successful episode's last output; all its outputs share the score.

    ``rows`` maps a group id to its dataset row. Failed episodes are skipped (counted).
    ``external`` episodes (gateway sessions of free-running clients) have no row: each
    output keeps the reward its client gave (``output.reward``).
    """
    ok = [e for e in episodes if e.ok and e.outputs]
    by_row = [e for e in ok if not e.external]
    requests = [
        RewardRequest.from_row(
            rows[e.group_id],
            _decode_response(tokenizer, e.outputs[-1].response_ids),
            episode_info(e.outputs[-1]),
        )
        for e in by_row
    ]
    scored = await rewards.score_batch(requests)
    score_of = {e.episode_id: r.score for e, r in zip(by_row, scored.results, strict=True)}
    samples = [
        Sample(
            output,
            episode.group_id,
            float(output.reward or 0.0)
            if episode.external
            else score_of[episode.episode_id] + output.extra.get("tool_reward", 0.0),
            row_index=episode.row_index,
            episode_id=episode.episode_id,
        )
        for episode in ok
        for output in episode.outputs
    ]
    metrics = dict(scored.metrics)
    if len(by_row) < len(ok):  # the score statistics cover the clients' rewards too
        episode_scores = [*score_of.values()]
        episode_scores += [float(e.outputs[-1].reward or 0.0) for e in ok if e.external]
        metrics["reward/score/mean"] = float(np.mean(episode_scores))
        metrics["reward/score/min"] = float(np.min(episode_scores))
        metrics["reward/score/max"] = float(np.max(episode_scores))
        metrics["rollout/external_episodes"] = float(len(ok) - len(by_row))
    metrics["rollout/failed_episodes"] = float(len(episodes) - len(ok))
    metrics.update(rollout_metrics(ok))
    return samples, metrics


def apply_rollout_correction(batch: Batch, cfg: AlgorithmConfig) -> dict[str, float]:
    """Mismatch metrics, and rollout-IS weights when configured (added to ``batch``).

    ``batch["old_log_probs"]`` are the trainer's behaviour log-probs; the rollout's own
    log-probs come per token from whichever policy version sampled it, so a trajectory
    that spans a weight swap gets a per-segment ratio automatically.
    """
    mask = batch["response_mask"]
    metrics = {
        k: float(v)
        for k, v in compute_mismatch_metrics(
            batch["old_log_probs"], batch["rollout_log_probs"], mask
        ).items()
    }
    if cfg.rollout_is_threshold is None:
        return metrics
    result = compute_rollout_is_weights(
        batch["old_log_probs"],
        batch["rollout_log_probs"],
        mask,
        threshold=cfg.rollout_is_threshold,
        threshold_lower=cfg.rollout_is_threshold_lower,
        level=cfg.rollout_is_level,
        mode=cfg.rollout_is_mode,
        veto_threshold=cfg.rollout_is_veto_threshold,
        apply_weights=cfg.rollout_is,
    )
    if result.weights is not None:
        batch["rollout_is_weights"] = result.weights
    metrics.update({k: float(v) for k, v in result.metrics.items()})
    return metrics


def probe_prompts(samples: list[Sample], rows: int) -> list[list[int]]:
    """``rows`` prompts of ``samples`` for the mismatch probe: one per group in turn, so
    that a few rows cover as many problems as they can."""
    distinct = list({s.group_id: s.output.prompt_ids for s in samples}.values())
    return [distinct[i % len(distinct)] for i in range(rows)] if distinct else []


def probe_batch(answered: list[tuple[list[int], TokenOutput]], pad_token_id: int) -> Batch | None:
    """``(prompt, replica's answer)`` pairs as a batch (``build_batch``'s layout, every
    response token the model's); None when no answer has a token."""
    samples = [
        Sample(
            AgentLoopOutput(
                prompt_ids=prompt,
                response_ids=out.token_ids,
                response_mask=[1] * len(out.token_ids),
                response_logprobs=out.logprobs,
                response_versions=out.token_versions,
            ),
            group_id="mismatch-probe",
            score=0.0,
        )
        for prompt, out in answered
        if out.token_ids
    ]
    return build_batch(samples, pad_token_id)[0] if samples else None


def mismatch_probe(batch: Batch, version: int, max_rows: int) -> Batch | None:
    """Up to ``max_rows`` rows of ``batch`` with tokens sampled by policy ``version``, their
    ``response_mask`` restricted to those tokens; None when no row has one.

    Recomputing log-probs on them with the actor at ``version`` measures the engine's
    numerical mismatch alone: tokens of older versions differ by the policy change too."""
    same = (batch["response_versions"] == version) & (batch["response_mask"] > 0)
    rows = torch.nonzero(same.any(dim=-1)).flatten()[:max_rows]
    if rows.numel() == 0:
        return None
    probe = {key: value[rows] for key, value in batch.items()}
    probe["response_mask"] = same[rows].to(batch["response_mask"].dtype)
    return probe


def mismatch_metrics(probe: Batch, log_probs: torch.Tensor) -> dict[str, float]:
    """``mismatch/`` metrics of the actor's ``log_probs`` on a ``mismatch_probe``."""
    metrics = compute_mismatch_metrics(
        log_probs, probe["rollout_log_probs"], probe["response_mask"]
    )
    return {
        **{key: float(value) for key, value in metrics.items()},
        "mismatch/probe_tokens": float(probe["response_mask"].sum()),
    }


def sample_groups(sampler: DynamicSampler[list[Sample]], samples: list[Sample]) -> None:
    """Give one generation batch to a DAPO dynamic ``sampler``, which keeps the groups
    whose samples did not all get the same score (may raise its ``DynamicSamplingError``)."""
    scores = torch.tensor([s.score for s in samples], dtype=torch.float64)
    sampler.add(samples, scores, [s.group_id for s in samples])


def sampled(sampler: DynamicSampler[list[Sample]], metrics: dict[str, float]) -> list[Sample]:
    """The samples ``sampler`` kept, in arrival order, with its counts added to ``metrics``
    as ``dapo/*``; the sampler starts over."""
    metrics |= {f"dapo/{name}": value for name, value in sampler.metrics().items()}
    return [samples[i] for samples, rows in sampler.take() for i in rows.tolist()]


def add_advantages(
    batch: Batch,
    group_ids: list[str],
    cfg: AlgorithmConfig,
    max_response_length: int,
    kl_controller: KLController | None = None,
) -> dict[str, float]:
    """Token rewards (+ overlong shaping, − in-reward KL) → advantages and returns.

    Results go into ``batch``; the in-reward KL needs ``batch["ref_log_probs"]``.
    """
    scores = batch["scores"].clone()
    mask = batch["response_mask"]
    if cfg.overlong.enable:
        lengths = mask.sum(dim=-1)
        scores = scores + overlong_penalty(
            lengths, max_response_length, cfg.overlong.buffer_length, cfg.overlong.penalty_factor
        )
    if cfg.credit == "per_turn" and "turn_rewards" in batch:
        # The turn rewards add up to the score; the overlong shaping goes on the last token.
        token_rewards = batch["turn_rewards"] + scores_to_token_rewards(
            scores - batch["scores"], mask
        )
    else:
        token_rewards = scores_to_token_rewards(scores, mask)
    metrics: dict[str, float] = {}
    if kl_controller is not None:
        token_rewards, kl_metrics = apply_kl_penalty(
            token_rewards,
            batch["old_log_probs"],
            batch["ref_log_probs"],
            mask,
            kl_controller,
            cfg.kl.kl_penalty,
        )
        metrics |= {f"actor/reward_{k}": float(v) for k, v in kl_metrics.items()}
    inputs = AdvantageInputs(
        token_level_rewards=token_rewards,
        response_mask=mask,
        index=group_ids,
        values=batch.get("values"),
        turn_index=batch.get("turn_index"),
    )
    result = compute_advantages(inputs, cfg)
    batch["advantages"] = result.advantages.float()
    batch["returns"] = result.returns.float()
    valid = mask.bool()
    return metrics | {
        "critic/score/mean": float(scores.mean()),
        "critic/advantages/mean": float(result.advantages[valid].mean()) if valid.any() else 0.0,
        "critic/advantages/max": float(result.advantages[valid].max()) if valid.any() else 0.0,
    }


def staleness_metrics(batch: Batch, version: int) -> dict[str, float]:
    """Per-row staleness (trainer version − oldest token version) summary."""
    versions = batch["response_versions"].masked_fill(batch["response_mask"] == 0, 1 << 40)
    oldest = versions.min(dim=-1).values
    has_tokens = oldest < (1 << 40)
    if not bool(has_tokens.any()):
        return {}
    staleness = (version - oldest[has_tokens]).float()
    metrics = {
        "async/staleness/mean": float(staleness.mean()),
        "async/staleness/max": float(staleness.max()),
    }
    for value in torch.unique(staleness).tolist():
        metrics[f"async/staleness/hist_{int(value)}"] = float((staleness == value).sum())
    return metrics
