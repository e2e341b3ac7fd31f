"""The algorithm config section: defaults, fallbacks, validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.algos import AlgorithmConfig, PolicyLossConfig
from agentrl.config import describe_config


def test_every_field_has_a_default_and_a_description():
    lines = describe_config(AlgorithmConfig)
    assert len(lines) > 30
    assert all(not line.endswith(": None") for line in lines)


def test_clip_bounds_fall_back_to_clip_ratio():
    cfg = PolicyLossConfig(clip_ratio=0.1, clip_ratio_high=0.28)
    assert (cfg.clip_low, cfg.clip_high) == (0.1, 0.28)


@pytest.mark.parametrize(
    "update",
    [
        {"policy_loss": {"clip_ratio_c": 1.0}},
        {"policy_loss": {"loss_agg_mode": "mean"}},
        {"kl": {"kl_loss_type": "k4"}},
        {"rollout_is_level": "row"},
        {"gamma": 1.5},
        {"unknown_knob": 1},
    ],
)
def test_invalid_values_are_rejected(update):
    with pytest.raises(ValidationError):
        AlgorithmConfig.model_validate(update)
