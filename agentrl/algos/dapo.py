"""DAPO (Yu et al., 2025): dynamic sampling and soft overlong punishment."""

from __future__ import annotations

from typing import Generic, TypeVar

import torch
from torch import Tensor

from agentrl.algos.ops import GroupIndex, group_ids

BatchT = TypeVar("BatchT")


def filter_groups(metric: Tensor, index: GroupIndex) -> Tensor:
    """``[B]`` bool: True for rows whose group's ``metric`` values are not all equal.

    A group whose samples all got the same reward has zero GRPO advantage and only
    dilutes the batch. Equality is exact (``max == min``), so float noise from a mean
    cannot keep a flat group. Single-sample groups are kept: under the singleton
    convention of :mod:`agentrl.algos.advantages` their raw score is the advantage.
    """
    ids, num_groups = group_ids(index, device=metric.device)
    return _informative_groups(metric, ids, num_groups)[ids]


def _informative_groups(metric: Tensor, ids: Tensor, num_groups: int) -> Tensor:
    """``[G]`` bool: the group's values differ, or it holds a single sample."""
    metric = metric.double()
    hi = torch.full((num_groups,), -torch.inf, dtype=metric.dtype, device=metric.device)
    lo = torch.full((num_groups,), torch.inf, dtype=metric.dtype, device=metric.device)
    hi = hi.scatter_reduce(0, ids, metric, reduce="amax")
    lo = lo.scatter_reduce(0, ids, metric, reduce="amin")
    count = torch.bincount(ids, minlength=num_groups)
    return (hi > lo) | (count == 1)


class DynamicSamplingError(RuntimeError):
    """Too many generation batches were needed to fill one train batch."""


class DynamicSampler(Generic[BatchT]):
    """Collect generation batches until ``num_groups`` informative groups are gathered.

    ::

        sampler = DynamicSampler(num_groups=train_batch_size, max_num_gen_batches=10)
        while not sampler.is_full:
            batch = generate(...)
            sampler.add(batch, metric=scores, index=uids)
        parts = sampler.take()  # [(batch, kept row indices), ...]

    Groups are taken in the order they arrive; rows of groups beyond ``num_groups``
    are dropped. The batch objects are held as they are; the caller selects the rows
    (``parts``) with its own batch type. A group must not span two generation batches.
    """

    def __init__(self, num_groups: int, max_num_gen_batches: int = 0) -> None:
        """``max_num_gen_batches = 0`` means unbounded."""
        if num_groups < 1:
            raise ValueError(f"num_groups must be ≥ 1, got {num_groups}")
        if max_num_gen_batches < 0:
            raise ValueError(f"max_num_gen_batches must be ≥ 0, got {max_num_gen_batches}")
        self.num_groups = num_groups
        self.max_num_gen_batches = max_num_gen_batches
        self._reset()

    def _reset(self) -> None:
        self._parts: list[tuple[BatchT, Tensor]] = []
        self._kept_groups = 0
        self._filtered_groups = 0
        self._surplus_groups = 0
        self._num_gen_batches = 0

    @property
    def is_full(self) -> bool:
        return self._kept_groups >= self.num_groups

    def add(self, batch: BatchT, metric: Tensor, index: GroupIndex) -> Tensor:
        """Filter one generation batch; return the indices of the rows kept from it.

        Raises :class:`DynamicSamplingError` when this was the last allowed generation
        batch and the train batch is still not full (the rows are kept and
        :meth:`metrics` still reports the counts).
        """
        if self.is_full:
            raise RuntimeError("DynamicSampler is full; call take() before adding more")
        self._num_gen_batches += 1
        ids, num_groups = group_ids(index, device=metric.device)
        informative = _informative_groups(metric, ids, num_groups)
        # Group ids follow first appearance, so a cumulative count ranks groups by arrival.
        rank = informative.cumsum(0) - 1
        wanted = informative & (rank < self.num_groups - self._kept_groups)
        kept_rows = torch.nonzero(wanted[ids]).squeeze(-1)
        num_informative, num_wanted = int(informative.sum()), int(wanted.sum())
        self._kept_groups += num_wanted
        self._filtered_groups += num_groups - num_informative
        self._surplus_groups += num_informative - num_wanted
        self._parts.append((batch, kept_rows))
        if not self.is_full and 0 < self.max_num_gen_batches <= self._num_gen_batches:
            raise DynamicSamplingError(
                f"dynamic sampling kept {self._kept_groups}/{self.num_groups} groups with "
                f"non-identical rewards after {self._num_gen_batches} generation batches "
                f"(max_num_gen_batches={self.max_num_gen_batches}); the prompts may be too "
                "easy or too hard for the policy: raise max_num_gen_batches (0 = unbounded) "
                "or disable dynamic sampling"
            )
        return kept_rows

    def take(self) -> list[tuple[BatchT, Tensor]]:
        """The gathered ``(batch, kept row indices)`` parts; the sampler starts over."""
        parts = self._parts
        self._reset()
        return parts

    def metrics(self) -> dict[str, float]:
        """Counts since the last :meth:`take`: generation batches and groups kept/dropped."""
        seen = self._kept_groups + self._filtered_groups + self._surplus_groups
        return {
            "num_gen_batches": float(self._num_gen_batches),
            "num_groups_kept": float(self._kept_groups),
            "num_groups_filtered": float(self._filtered_groups),
            "num_groups_surplus": float(self._surplus_groups),
            "filtered_group_fraction": self._filtered_groups / max(seen, 1),
        }


def overlong_penalty(
    response_lengths: Tensor,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """Soft overlong punishment, to add to the sequence reward.

    With ``L_max = max_response_length``, ``L_buf = buffer_length`` and ``l`` the
    response length:
    ``penalty = -penalty_factor · clip((l - (L_max - L_buf)) / L_buf, 0, 1)``:
    0 up to ``L_max - L_buf``, then linear down to ``-penalty_factor`` at ``L_max``.
    """
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(
            f"overlong buffer_length must be in (0, max_response_length="
            f"{max_response_length}], got {buffer_length}"
        )
    excess = response_lengths.to(torch.get_default_dtype()) - (max_response_length - buffer_length)
    return -penalty_factor * (excess / buffer_length).clamp(0.0, 1.0)
