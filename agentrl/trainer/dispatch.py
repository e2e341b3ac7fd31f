"""Training batches and how the driver splits them across data-parallel ranks.

A batch is a ``dict[str, Tensor]`` whose tensors all share the first (row) dimension:

- ``input_ids [B, L]`` and ``attention_mask [B, L]`` (1 = real token): prompt and
  response of each row, padded anywhere (typically prompt left-padded, response
  right-padded);
- ``response_mask [B, R]`` (1 = token the loss applies to): *response-aligned*, i.e.
  column ``j`` describes token ``L - R + j`` of ``input_ids``;
- any other tensors (``old_log_probs``, ``advantages``, ``ref_log_prob``,
  ``rollout_is_weights``, ``values``, ``returns``, ...) travel with their rows to the
  loss function; per-token ones are response-aligned ``[B, R]``.

Rows go to ranks so that every rank gets the same number of rows (±1) and nearly the
same number of tokens: the slowest rank sets the pace of every collective.
"""

from __future__ import annotations

import heapq

import torch
from torch import Tensor

Batch = dict[str, Tensor]
"""Row-aligned tensors; see the module docstring for the keys the workers read."""

REQUIRED_KEYS = ("input_ids", "attention_mask", "response_mask")
MINI_BATCH_KEY = "mini_batch_index"
"""Added by :func:`shard_mini_batches`: the optimizer step each row belongs to."""


def num_rows(batch: Batch) -> int:
    """The number of rows (sequences) of ``batch``."""
    return int(batch["input_ids"].shape[0])


def validate_batch(batch: Batch) -> None:
    """Raise ``ValueError`` naming the problem if ``batch`` is not a valid training batch."""
    missing = [key for key in REQUIRED_KEYS if key not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing}; it has {sorted(batch)}")
    ids, attn, resp = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    if ids.dim() != 2 or attn.shape != ids.shape:
        raise ValueError(
            f"input_ids {tuple(ids.shape)} and attention_mask {tuple(attn.shape)} must be the "
            "same [B, L] shape"
        )
    if resp.dim() != 2 or resp.shape[0] != ids.shape[0] or resp.shape[1] > ids.shape[1]:
        raise ValueError(
            f"response_mask {tuple(resp.shape)} must be [B, R] with R <= L for input_ids "
            f"{tuple(ids.shape)}"
        )
    for key, value in batch.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"batch[{key!r}] is a {type(value).__name__}, not a tensor")
        if value.shape[:1] != ids.shape[:1]:
            raise ValueError(f"batch[{key!r}] has {value.shape[0]} rows, input_ids {ids.shape[0]}")
    if bool((resp.bool() & ~attn[:, -resp.shape[1] :].bool()).any()):
        raise ValueError("response_mask marks tokens whose attention_mask is 0 (padding)")


def select_rows(batch: Batch, rows: Tensor | list[int]) -> Batch:
    """The sub-batch of ``rows`` (in that order)."""
    index = torch.as_tensor(rows, dtype=torch.long)
    return {key: value.index_select(0, index) for key, value in batch.items()}


def sequence_lengths(batch: Batch) -> list[int]:
    """Real (attended) tokens of every row: what a packed forward costs."""
    return batch["attention_mask"].sum(dim=1).tolist()


def balanced_partition(weights: list[int], parts: int) -> list[list[int]]:
    """Split item indices into ``parts`` groups of equal size (±1) and near-equal weight.

    Greedy: the heaviest remaining item goes to the lightest group that still has room.
    Each group is returned in ascending index order. Needs ``len(weights) >= parts``.
    """
    if len(weights) < parts:
        raise ValueError(
            f"cannot give each of {parts} ranks a sequence: the batch has {len(weights)}; "
            "use a batch (and mini-batch) of at least world_size sequences"
        )
    base, extra = divmod(len(weights), parts)  # `extra` groups get base + 1 items
    groups: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, p) for p in range(parts)]  # (weight, group) of groups with room left
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, part = heapq.heappop(heap)
        while len(groups[part]) >= base + (1 if extra > 0 else 0):
            load, part = heapq.heappop(heap)  # full: drop it for good
        groups[part].append(item)
        if len(groups[part]) == base + 1:
            extra -= 1
        heapq.heappush(heap, (load + weights[item], part))
    return [sorted(group) for group in groups]


def shard_rows(batch: Batch, world_size: int) -> tuple[list[Batch], list[list[int]]]:
    """Balanced DP shards of ``batch`` and the original row indices of each shard."""
    rows = balanced_partition(sequence_lengths(batch), world_size)
    return [select_rows(batch, r) for r in rows], rows


def mini_batch_ranges(batch_size: int, mini_batch_size: int) -> list[range]:
    """``max(1, B // mini_batch_size)`` contiguous, near-equal row ranges covering the batch."""
    count = max(1, batch_size // mini_batch_size)
    bounds = [round(i * batch_size / count) for i in range(count + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(count)]


def shard_mini_batches(
    batch: Batch, world_size: int, mini_batch_size: int
) -> tuple[list[Batch], int]:
    """Split ``batch`` into mini-batches, then balance each mini-batch across ranks.

    Every rank's shard holds its part of every mini-batch, tagged with
    ``MINI_BATCH_KEY``; the mini-batches are the same whatever the world size, so a
    run on N ranks takes the same optimizer steps as one on a single rank.
    Returns the shards and the number of mini-batches.
    """
    ranges = mini_batch_ranges(num_rows(batch), mini_batch_size)
    lengths = sequence_lengths(batch)
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    tags: list[list[int]] = [[] for _ in range(world_size)]
    for index, rows in enumerate(ranges):
        try:
            parts = balanced_partition([lengths[r] for r in rows], world_size)
        except ValueError as exc:
            raise ValueError(f"mini-batch {index} of {len(rows)} sequences: {exc}") from None
        for rank, part in enumerate(parts):
            per_rank[rank].extend(rows[i] for i in part)
            tags[rank].extend([index] * len(part))
    shards = []
    for rank in range(world_size):
        shard = select_rows(batch, per_rank[rank])
        shard[MINI_BATCH_KEY] = torch.tensor(tags[rank], dtype=torch.long)
        shards.append(shard)
    return shards, len(ranges)


def gather_rows(parts: list[Tensor], rows: list[list[int]], batch_size: int) -> Tensor:
    """Inverse of :func:`shard_rows` for one output: rank results back in batch order."""
    out = parts[0].new_zeros((batch_size, *parts[0].shape[1:]))
    for part, index in zip(parts, rows, strict=True):
        out[torch.as_tensor(index, dtype=torch.long)] = part
    return out
