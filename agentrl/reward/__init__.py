"""Rewards: the ``compute_score`` interface, built-in math scoring, concurrent scoring."""

from agentrl.reward.builtin import (
    ScoreFn,
    default_compute_score,
    get_scorer,
    math_scorer,
    register_scorer,
)
from agentrl.reward.config import RewardConfig
from agentrl.reward.loader import RewardFnRef, load_reward_fn
from agentrl.reward.manager import RewardBatch, RewardManager, RewardRequest, RewardResult
from agentrl.reward.math_score import (
    answers_match,
    compute_score,
    extract_answer,
    normalize_answer,
)

__all__ = [
    "RewardBatch",
    "RewardConfig",
    "RewardFnRef",
    "RewardManager",
    "RewardRequest",
    "RewardResult",
    "ScoreFn",
    "answers_match",
    "compute_score",
    "default_compute_score",
    "extract_answer",
    "get_scorer",
    "load_reward_fn",
    "math_scorer",
    "normalize_answer",
    "register_scorer",
]
