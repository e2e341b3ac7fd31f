"""Loss aggregation modes against a plain loop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos import LOSS_AGG_MODES, agg_loss

from .common import ragged_mask, randn, reference_agg


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    length=st.integers(1, 9),
    mode=st.sampled_from(LOSS_AGG_MODES),
    norm_constant=st.sampled_from([None, 16.0]),
)
def test_every_mode_matches_a_plain_loop(seed, batch, length, mode, norm_constant):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, length, empty_rows=min(1, batch - 1))
    loss = randn(gen, batch, length)
    got = agg_loss(loss, mask, mode, norm_constant=norm_constant)
    want = reference_agg(loss.tolist(), mask.tolist(), mode, norm_constant)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_masked_batch_gives_zero_with_finite_gradient(mode):
    loss = torch.full((3, 4), float("nan"), dtype=torch.float64, requires_grad=True)
    out = agg_loss(loss, torch.zeros(3, 4), mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.isfinite(loss.grad).all()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_padding_values_never_reach_the_result(mode):
    gen = torch.Generator().manual_seed(0)
    mask = ragged_mask(gen, 5, 7)
    loss = randn(gen, 5, 7)
    poisoned = torch.where(mask.bool(), loss, torch.inf)
    assert agg_loss(poisoned, mask, mode).item() == pytest.approx(agg_loss(loss, mask, mode).item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_denominator_sum_to_the_full_loss(mode):
    gen = torch.Generator().manual_seed(1)
    mask = ragged_mask(gen, 8, 6, empty_rows=2)
    loss = randn(gen, 8, 6)
    full = agg_loss(loss, mask, mode, norm_constant=6.0)
    denominator = mask.sum() if mode == "token-mean" else (mask.sum(-1) > 0).sum()
    parts = sum(
        agg_loss(loss[i : i + 3], mask[i : i + 3], mode, norm_constant=6.0, denominator=denominator)
        for i in range(0, 8, 3)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-12)


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(torch.ones(1, 1), torch.ones(1, 1), "mean")  # type: ignore[arg-type]
