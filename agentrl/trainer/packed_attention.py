"""``packed_sdpa``: attention over packed micro-batches at the cost of its sequences.

The trainer packs a micro-batch's rows into one sequence (:func:`pack_rows`). With
transformers' ``sdpa`` that pack gets a block-diagonal causal mask, and attention costs
grow with the square of the whole pack's length. ``packed_sdpa`` runs causal SDPA on
each sequence's own span, given by the ``packed_spans`` (host integers) and
``cu_seq_lens_q`` (the keyword flash-attention's variable-length kernels take) that
:meth:`PackedRows.attention_kwargs` passes through the model's forward, and concatenates
the results. Without ``cu_seq_lens_q`` it is exactly ``sdpa`` (same mask, same kernel).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "packed_sdpa"


def packed_sdpa_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    cu_seq_lens_q: Tensor | None = None,
    packed_spans: Sequence[tuple[int, int]] | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Causal SDPA per packed sequence; ``query``/``key``/``value`` are ``[1, heads, N, d]``.

    ``packed_spans``: the sequences' ``(start, end)`` as host integers; without them they
    are read from ``cu_seq_lens_q`` (in every layer: a device sync each on GPU).
    """
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    if query.shape[0] != 1 or kwargs.get("sliding_window") is not None:
        raise ValueError("packed_sdpa takes one packed row without sliding-window attention")
    if packed_spans is None:
        packed_spans = [(s, e) for s, e in pairwise(cu_seq_lens_q.tolist()) if e > s]
    outputs = [
        sdpa_attention_forward(
            module,
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            None,
            dropout,
            scaling,
            is_causal=True,
        )[0]
        for s, e in packed_spans
    ]
    return torch.cat(outputs, dim=1), None


def register_packed_sdpa() -> None:
    """Make ``attn_implementation="packed_sdpa"`` loadable (idempotent)."""
    AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
