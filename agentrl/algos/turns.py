"""Where a trajectory's per-turn rewards go among its response tokens (``credit: per_turn``).

A multi-turn trajectory records, per model turn, the reward the environment gave for it
and the response position where that turn ends (``turn_rewards``, ``turn_ends`` of the
env loop). :func:`turn_layout` turns them into two response-aligned rows: the model turn
of every model token and the token rewards, each turn's reward on its last model token.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["turn_layout"]


def _check(turn_ends: Sequence[int], turn_rewards: Sequence[float], length: int) -> None:
    if len(turn_ends) != len(turn_rewards):
        raise ValueError(
            f"{len(turn_rewards)} turn rewards for {len(turn_ends)} turn ends: one reward "
            "per model turn"
        )
    previous = 0
    for end in turn_ends:
        if not isinstance(end, numbers.Integral) or not previous <= end <= length:
            raise ValueError(
                f"turn ends {list(turn_ends)} must be non-decreasing response positions in "
                f"[0, {length}]"
            )
        previous = end
    for reward in turn_rewards:
        if not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise ValueError(f"turn rewards {list(turn_rewards)} must be finite numbers")


def turn_layout(
    response_mask: Tensor,
    score: float,
    turn_ends: Sequence[int] | None = None,
    turn_rewards: Sequence[float] | None = None,
) -> tuple[Tensor, Tensor]:
    """``([T]`` turn index, ``[T]`` reward) of a row's response tokens; the turn is -1
    off model tokens (``response_mask`` 0).

    Model turn ``k`` holds the model tokens before ``turn_ends[k]`` and at or after
    ``turn_ends[k-1]``; model tokens after the last end form one more turn, with reward 0.
    The part of ``score`` the turn rewards do not account for (``score - Σ turn_rewards``:
    a reward function's own score, tool rewards) goes to the last turn, so the rewards of a
    row always add up to its ``score``. A turn without model tokens passes its reward to
    the turn before it (to the first turn when none is before), and turns are numbered
    0, 1, ... over those with tokens. Without ``turn_ends``/``turn_rewards`` the row is one
    turn earning ``score``. A row without model tokens gets no reward (as with
    ``scores_to_token_rewards``).

    Raises ``ValueError`` for ends and rewards of different lengths, ends that decrease
    or leave the response, and rewards that are not finite numbers.
    """
    length = response_mask.shape[-1]
    ends: Sequence[int] = []
    rewards: list[float] = []
    if turn_ends is not None and turn_rewards is not None:
        _check(turn_ends, turn_rewards, length)
        ends, rewards = turn_ends, [float(r) for r in turn_rewards]
    turns = torch.full((length,), -1, dtype=torch.long)
    token_rewards = torch.zeros(length, dtype=torch.float64)
    positions = torch.nonzero(response_mask).flatten()
    if positions.numel() == 0:
        return turns, token_rewards.float()
    raw_turn = torch.bucketize(positions, torch.tensor(ends, dtype=torch.long), right=True)
    present = torch.unique(raw_turn)  # sorted raw turns that have model tokens
    raw_rewards = torch.tensor([*rewards, 0.0], dtype=torch.float64)  # trailing turn: 0
    raw_rewards[present[-1]] += float(score) - sum(rewards)
    # Each raw turn's reward goes to the nearest turn with tokens at or before it.
    target = (torch.searchsorted(present, torch.arange(len(raw_rewards)), right=True) - 1).clamp(
        min=0
    )
    merged = torch.zeros(len(present), dtype=torch.float64).index_add_(0, target, raw_rewards)
    number = torch.searchsorted(present, raw_turn)
    turns[positions] = number
    last = torch.full((len(present),), -1, dtype=torch.long).scatter_reduce_(
        0, number, positions, reduce="amax"
    )
    token_rewards[last] = merged
    return turns, token_rewards.float()
