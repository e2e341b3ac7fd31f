"""Turn finished episodes into a padded training batch (see ``dispatch`` for the layout)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.algos.turns import turn_layout
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.trainer.dispatch import Batch


@dataclass
class Sample:
    """One training row: a loop output with its episode's group and reward."""

    output: AgentLoopOutput
    group_id: str
    score: float
    row_index: int = -1
    """The dataset row of its episode (-1: none, e.g. a gateway session)."""
    episode_id: str = ""


def build_batch(samples: list[Sample], pad_token_id: int) -> tuple[Batch, list[str]]:
    """Left-pad prompts, right-pad responses; returns the batch and each row's group id.

    Keys: ``input_ids``, ``attention_mask``, ``response_mask`` (model tokens),
    ``rollout_log_probs``, ``response_versions``, ``scores``, ``sample_weight``, and for
    ``credit: per_turn`` ``turn_index``/``turn_rewards`` (``agentrl.algos.turns``: from
    the output's ``extra["turn_ends"]``/``extra["turn_rewards"]`` when it has both).
    """
    if not samples:
        raise ValueError("cannot build a training batch from zero samples")
    prompt_len = max(len(s.output.prompt_ids) for s in samples)
    response_len = max(max(len(s.output.response_ids) for s in samples), 1)
    rows = len(samples)
    input_ids = torch.full((rows, prompt_len + response_len), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_mask = torch.zeros((rows, response_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((rows, response_len), dtype=torch.float32)
    versions = torch.full((rows, response_len), -1, dtype=torch.long)
    turn_index = torch.full((rows, response_len), -1, dtype=torch.long)
    turn_rewards = torch.zeros((rows, response_len), dtype=torch.float32)
    for i, sample in enumerate(samples):
        out = sample.output
        p, r = len(out.prompt_ids), len(out.response_ids)
        input_ids[i, prompt_len - p : prompt_len] = torch.tensor(out.prompt_ids)
        attention[i, prompt_len - p : prompt_len + r] = 1
        if r:
            input_ids[i, prompt_len : prompt_len + r] = torch.tensor(out.response_ids)
            response_mask[i, :r] = torch.tensor(out.response_mask, dtype=torch.float32)
            rollout_log_probs[i, :r] = torch.tensor(out.response_logprobs)
            versions[i, :r] = torch.tensor(out.response_versions)
            turn_index[i, :r], turn_rewards[i, :r] = turn_layout(
                response_mask[i, :r],
                sample.score,
                out.extra.get("turn_ends"),
                out.extra.get("turn_rewards"),
            )
    batch: Batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
        "response_versions": versions,
        "turn_index": turn_index,
        "turn_rewards": turn_rewards,
        "scores": torch.tensor([s.score for s in samples], dtype=torch.float32),
        "sample_weight": torch.tensor(
            [float(s.output.extra.get("sample_weight", 1.0)) for s in samples]
        ),
    }
    return batch, [s.group_id for s in samples]


def response_lengths(batch: Batch) -> Tensor:
    """Model tokens per row."""
    return batch["response_mask"].sum(dim=-1)
