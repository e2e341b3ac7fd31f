"""Turn finished episodes into a padded training batch (see ``dispatch`` for the layout)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
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
    outputs = [s.output for s in samples]
    prompt_lengths = torch.tensor([len(o.prompt_ids) for o in outputs])
    response_lengths = torch.tensor([len(o.response_ids) for o in outputs])
    prompt_len = int(prompt_lengths.max())
    response_len = max(int(response_lengths.max()), 1)
    # Each field's tokens of all rows go into the batch in one vectorised copy: row-major
    # order of a mask's True cells is the order of the rows' tokens laid end to end.
    in_prompt = torch.arange(prompt_len) >= prompt_len - prompt_lengths.unsqueeze(1)
    in_response = torch.arange(response_len) < response_lengths.unsqueeze(1)

    def laid_out(field: str, dtype: type[np.generic], fill: float, where: Tensor) -> Tensor:
        values = _concatenated(outputs, field, dtype)
        out = torch.full(where.shape, fill, dtype=values.dtype)
        out[where] = values
        return out

    response_mask = laid_out("response_mask", np.float32, 0, in_response)
    batch: Batch = {
        "input_ids": torch.cat(
            [
                laid_out("prompt_ids", np.int64, pad_token_id, in_prompt),
                laid_out("response_ids", np.int64, pad_token_id, in_response),
            ],
            dim=1,
        ),
        "attention_mask": torch.cat([in_prompt, in_response], dim=1).long(),
        "response_mask": response_mask,
        "rollout_log_probs": laid_out("response_logprobs", np.float32, 0, in_response),
        "response_versions": laid_out("response_versions", np.int64, -1, in_response),
        "scores": torch.tensor([s.score for s in samples], dtype=torch.float32),
        "sample_weight": torch.tensor([float(o.extra.get("sample_weight", 1.0)) for o in outputs]),
    }
    batch["turn_index"], batch["turn_rewards"] = _turns(samples, response_mask, batch["scores"])
    return batch, [s.group_id for s in samples]


def _concatenated(outputs: list[AgentLoopOutput], field: str, dtype: type[np.generic]) -> Tensor:
    """``field`` of every output, laid end to end (one conversion of all their values)."""
    values = [getattr(output, field) for output in outputs]
    count = sum(len(v) for v in values)
    return torch.from_numpy(np.fromiter(chain.from_iterable(values), dtype=dtype, count=count))


def _turns(samples: list[Sample], response_mask: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
    """``turn_index`` and ``turn_rewards`` (``turn_layout``'s, row by row): a row without
    turn ends is one turn whose last model token earns its score (``scores``), computed
    for all such rows at once."""
    model = response_mask > 0
    turn_index = torch.where(model, 0, -1)
    turn_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (model * torch.arange(model.shape[1])).argmax(dim=1)
    rows = torch.nonzero(model.any(dim=1)).flatten()
    turn_rewards[rows, last[rows]] = scores[rows]
    for i, sample in enumerate(samples):
        extra = sample.output.extra
        if extra.get("turn_ends") is None or extra.get("turn_rewards") is None:
            continue
        r = len(sample.output.response_ids)
        turn_index[i].fill_(-1)
        turn_rewards[i].zero_()
        turn_index[i, :r], turn_rewards[i, :r] = turn_layout(
            response_mask[i, :r], sample.score, extra["turn_ends"], extra["turn_rewards"]
        )
    return turn_index, turn_rewards


def response_lengths(batch: Batch) -> Tensor:
    """Model tokens per row."""
    return batch["response_mask"].sum(dim=-1)
