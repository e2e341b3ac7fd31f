"""Reduce a per-token loss matrix ``[B, T]`` to the scalar that is back-propagated."""

from __future__ import annotations

from typing import get_args

from torch import Tensor

from agentrl.algos.config import LossAggMode
from agentrl.algos.ops import masked_count, masked_sum

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: LossAggMode,
    *,
    norm_constant: float | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Aggregate ``loss_mat`` over the unmasked tokens.

    With ``m`` the mask, ``n_i = Σ_t m_it`` and ``S`` the rows with ``n_i > 0``:

    - ``token-mean``: ``Σ_it L_it m_it / Σ_it m_it`` (every token weighs the same);
    - ``seq-mean-token-sum``: ``(1/|S|) Σ_i Σ_t L_it m_it``;
    - ``seq-mean-token-mean``: ``(1/|S|) Σ_i (Σ_t L_it m_it / n_i)`` (every sequence weighs
      the same);
    - ``seq-mean-token-sum-norm``: ``(1/|S|) Σ_i Σ_t L_it m_it / C`` with the constant
      ``C = norm_constant`` (default: the padded length ``T``), as in Dr.GRPO, so that
      no sequence length enters the normalisation.

    Rows with no unmasked token are left out of ``|S|``; with nothing unmasked at all
    the result is 0 (still connected to the graph), never nan.

    ``denominator`` replaces the local count (tokens for ``token-mean``, sequences
    otherwise). Pass the count of the whole batch when it is split into micro-batches
    or ranks, so that the sum of the parts equals the loss of the whole.
    """
    if mode == "token-mean":
        total = masked_sum(loss_mat, mask)
        count = masked_count(mask)
    elif mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        row_sums = masked_sum(loss_mat, mask, dim=-1)
        row_counts = masked_count(mask, dim=-1)
        if mode == "seq-mean-token-mean":
            row_sums = row_sums / row_counts.clamp(min=1).to(loss_mat.dtype)
        elif mode == "seq-mean-token-sum-norm":
            row_sums = row_sums / (loss_mat.shape[-1] if norm_constant is None else norm_constant)
        total = row_sums.sum()
        count = (row_counts > 0).sum()
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")
    if denominator is None:
        return total / count.clamp(min=1).to(total.dtype)
    return total / denominator
