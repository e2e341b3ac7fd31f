"""``packed_sdpa``: attention over packed micro-batches at the cost of its sequences.

The trainer packs a micro-batch's rows into one sequence (:func:`pack_rows`). With
transformers' ``sdpa`` that pack gets a block-diagonal causal mask, and attention costs
grow with the square of the whole pack's length. ``packed_sdpa`` runs causal SDPA on
each sequence's own span, given by the ``cu_seq_lens_q`` that
:meth:`PackedRows.attention_kwargs` passes through the model's forward (the same
keyword flash-attention's variable-length kernels take), and concatenates the results.
Without ``cu_seq_lens_q`` it is exactly ``sdpa`` (same mask, same kernel).
"""

from __future__ import annotations

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
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Causal SDPA per packed sequence; ``query``/``key``/``value`` are ``[1, heads, N, d]``."""
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    if query.shape[0] != 1 or kwargs.get("sliding_window") is not None:
        raise ValueError("packed_sdpa takes one packed row without sliding-window attention")
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
        for s, e in _spans(cu_seq_lens_q)
    ]
    return torch.cat(outputs, dim=1), None


# Every layer of one forward gets the same ``cu_seq_lens_q``, and reading it to the host is
# a device sync on GPU: the spans are read once per forward. Read and replaced as a whole,
# so ranks running as threads of one process cannot see each other's half-updated entry.
_last_spans: tuple[Tensor, list[tuple[int, int]]] | None = None


def _spans(cu_seq_lens: Tensor) -> list[tuple[int, int]]:
    """The non-empty ``(start, end)`` spans of ``cu_seq_lens``."""
    global _last_spans
    cached = _last_spans
    if cached is None or cached[0] is not cu_seq_lens:
        spans = [(s, e) for s, e in pairwise(cu_seq_lens.tolist()) if e > s]
        cached = _last_spans = (cu_seq_lens, spans)
    return cached[1]


def register_packed_sdpa() -> None:
    """Make ``attn_implementation="packed_sdpa"`` loadable (idempotent)."""
    AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
