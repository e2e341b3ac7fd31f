"""Clipped critic loss against a per-token reference."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import value_loss

from .common import ragged_mask, randn, reference_agg, valid_positions


@pytest.mark.parametrize("seed", range(3))
def test_value_loss_takes_the_larger_of_clipped_and_unclipped_error(seed):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, 6, 7)
    old = randn(gen, 6, 7)
    values = (old + randn(gen, 6, 7, scale=0.5)).requires_grad_(True)
    returns = randn(gen, 6, 7)
    out = value_loss(values, old, returns, mask, clip_range=0.2)
    out.loss.backward()

    loss, clipped_count = [], 0
    for v_row, o_row, r_row, m_row in zip(
        values.tolist(), old.tolist(), returns.tolist(), mask.tolist(), strict=True
    ):
        row = []
        for t, (v, o, r) in enumerate(zip(v_row, o_row, r_row, strict=True)):
            vc = o + min(max(v - o, -0.2), 0.2)
            e, ec = (v - r) ** 2, (vc - r) ** 2
            row.append(max(e, ec))
            clipped_count += ec > e and t in valid_positions(m_row)
        loss.append(row)
    assert out.loss.item() == pytest.approx(0.5 * reference_agg(loss, mask.tolist(), "token-mean"))
    assert out.metrics["vf_clipfrac"].item() == pytest.approx(clipped_count / mask.sum().item())
    assert torch.isfinite(values.grad).all()
