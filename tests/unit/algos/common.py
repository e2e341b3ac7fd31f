"""Random ragged batches for the algorithm tests, plus plain-Python views of them."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Relative tolerance for a torch result against one computed with another library's exp:
# torch's and numpy's float64 exp on the same input have been seen to differ by 3.3e-9.
EXP_REL_TOL = 1e-8


def ragged_mask(gen: torch.Generator, batch: int, length: int, empty_rows: int = 1) -> Tensor:
    """``[B, T]`` float64 mask: random response lengths, tool-output holes, empty rows.

    The first ``empty_rows`` rows have no model token at all.
    """
    mask = torch.zeros(batch, length, dtype=torch.float64)
    for i in range(empty_rows, batch):
        n = int(torch.randint(1, length + 1, (1,), generator=gen))
        mask[i, :n] = 1.0
        if n >= 4 and bool(torch.rand((), generator=gen) < 0.5):
            start = int(torch.randint(1, n - 2, (1,), generator=gen))
            mask[i, start : start + 2] = 0.0  # a tool response inside a multi-turn episode
    return mask


def group_uids(gen: torch.Generator, batch: int) -> list[str]:
    """Uids of consecutive groups of random size 1..4 (singletons included)."""
    uids: list[str] = []
    while len(uids) < batch:
        size = int(torch.randint(1, 5, (1,), generator=gen))
        uids += [f"prompt-{len(uids)}"] * size
    return uids[:batch]


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def valid_positions(mask_row: list[float]) -> list[int]:
    return [t for t, m in enumerate(mask_row) if m > 0]


def groups_of(index: list[str]) -> dict[str, list[int]]:
    """Row indices by group uid, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(index):
        groups.setdefault(key, []).append(i)
    return groups


def group_baseline(values: list[float]) -> tuple[float, float]:
    """GRPO's (mean, unbiased std) of a group's values; (0, 1) for a singleton group."""
    if len(values) == 1:
        return 0.0, 1.0
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def reference_agg(loss, mask, mode, norm_constant=None):
    """The four loss aggregation modes, one row and token at a time."""
    length = len(loss[0])
    tok_sum, tok_count, seq_terms = 0.0, 0, []
    for row, mrow in zip(loss, mask, strict=True):
        pos = valid_positions(mrow)
        s = sum(row[t] for t in pos)
        tok_sum, tok_count = tok_sum + s, tok_count + len(pos)
        if not pos:
            continue
        if mode == "seq-mean-token-sum":
            seq_terms.append(s)
        elif mode == "seq-mean-token-mean":
            seq_terms.append(s / len(pos))
        elif mode == "seq-mean-token-sum-norm":
            seq_terms.append(s / (norm_constant or length))
    if mode == "token-mean":
        return tok_sum / tok_count if tok_count else 0.0
    return sum(seq_terms) / len(seq_terms) if seq_terms else 0.0
