"""Masked reductions and group ids."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import masked_mean, masked_whiten
from agentrl.algos.ops import group_ids, masked_var


def test_masked_mean_ignores_padding_and_is_zero_when_empty():
    x = torch.tensor([[1.0, 2.0, torch.nan], [torch.inf, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, mask).item() == 1.5
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 0.0]


def test_whiten_uses_unbiased_variance_and_handles_tiny_inputs():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    got = masked_whiten(x, mask)[0].tolist()
    assert got == pytest.approx([-1 / math.sqrt(1 + 1e-8), 0.0, 1 / math.sqrt(1 + 1e-8), 0.0])
    assert masked_whiten(x, torch.tensor([[0, 1, 0, 0]])).tolist() == [[0.0] * 4]
    assert masked_whiten(x, torch.zeros(1, 4)).tolist() == [[0.0] * 4]


def test_group_ids_follow_first_appearance_for_any_key_type():
    ids, n = group_ids(["b", "a", "b", "c"])
    assert (ids.tolist(), n) == ([0, 1, 0, 2], 3)
    ids, n = group_ids(torch.tensor([7, 3, 7]))
    assert (ids.tolist(), n) == ([0, 1, 0], 2)
