"""Masked reductions and group bookkeeping shared by the algorithm modules.

Masks are ``[B, T]`` tensors of 0/1 (any dtype). Values at masked positions are
never read: they are replaced by zero with ``torch.where``, so padding that holds
``inf`` or ``nan`` cannot leak into a result or its gradient.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

Metrics = dict[str, Tensor]
"""Metric name → detached 0-dim tensor (the caller decides when to sync to host)."""

GroupIndex = Tensor | Sequence[Hashable]
"""One group key per row (e.g. the prompt uid shared by the n samples of a prompt)."""


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask`` over ``dim`` (all elements when ``dim`` is None)."""
    kept = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of unmasked elements over ``dim``, as a long tensor."""
    b = mask.bool()
    return b.sum() if dim is None else b.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ x·mask / max(Σ mask, 1)``: 0 (not nan) where nothing is unmasked."""
    return masked_sum(x, mask, dim) / masked_count(mask, dim).clamp(min=1).to(x.dtype)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance ``Σ (x - mean)²·mask / (n - 1)`` over all unmasked elements; 0 if n < 2."""
    n = masked_count(mask)
    centered = x - masked_mean(x, mask)
    return masked_sum(centered * centered, mask) / (n - 1).clamp(min=1).to(x.dtype)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with masked mean and unbiased variance; 0 where masked.

    With fewer than two unmasked elements the variance is 0, so the single element
    maps to 0 and an all-masked input gives all zeros.
    """
    whitened = (x - masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + eps)
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def group_ids(index: GroupIndex, device: torch.device | None = None) -> tuple[Tensor, int]:
    """Map group keys to dense ids ``0..G-1`` in order of first appearance.

    Returns the ``[B]`` long tensor of ids and the number of groups ``G``.
    """
    keys = index.tolist() if isinstance(index, Tensor) else list(index)
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(k, len(dense)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def group_sum(values: Tensor, ids: Tensor, num_groups: int) -> Tensor:
    """``[G]`` per-group sums of the ``[B]`` ``values``."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, ids, values
    )
