"""Micro-batches without padding: token-budget planning, sequence packing, loss contract.

A micro-batch is a set of rows packed into one ``[1, N]`` sequence with no padding at
all: each row's real tokens one after the other, ``position_ids`` restarting at 0 for
each row. Hugging Face models keep packed sequences apart when ``attention_mask`` is
None (sdpa/eager build a block-diagonal causal mask from the position ids;
flash-attention uses variable-length kernels). The LM head runs only at the positions
that predict a response token (``logits_to_keep``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class MicroBatch:
    """What a loss function sees of one micro-batch.

    ``data`` holds the micro-batch's rows of every batch tensor (per-token ones are
    response-aligned ``[b, R]``). ``global_num_tokens`` and ``global_num_seqs`` count
    the loss tokens (``response_mask``) and the sequences with at least one of them in
    the whole mini-batch, over all micro-batches and ranks.
    """

    data: dict[str, Tensor]
    global_num_tokens: int
    global_num_seqs: int

    def __getitem__(self, key: str) -> Tensor:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def get(self, key: str) -> Tensor | None:
        """``data[key]`` or None."""
        return self.data.get(key)


Metrics = Mapping[str, float | Tensor]


class PolicyLossFn(Protocol):
    """``loss_fn(log_probs, entropy, micro_batch) -> (loss, metrics)`` of ``update_actor``.

    ``log_probs`` and ``entropy`` (None unless requested) are ``[b, R]``, with grad.
    The returned loss is this micro-batch's *share* of the mini-batch loss: normalise
    by ``micro_batch.global_num_tokens`` (token-mean) or ``global_num_seqs``
    (sequence-mean), not by local counts, so that the sum over micro-batches and ranks
    is the loss of the whole mini-batch whatever the split. Metrics are averaged over
    micro-batches weighted by their loss tokens.
    """

    def __call__(
        self, log_probs: Tensor, entropy: Tensor | None, micro_batch: MicroBatch
    ) -> tuple[Tensor, Metrics]: ...


class ValueLossFn(Protocol):
    """``loss_fn(values, micro_batch) -> (loss, metrics)`` of ``update_critic``.

    ``values`` is ``[b, R]`` with grad; the batch carries the old ``values`` and the
    ``returns`` for value clipping. Same normalisation contract as :class:`PolicyLossFn`.
    """

    def __call__(self, values: Tensor, micro_batch: MicroBatch) -> tuple[Tensor, Metrics]: ...


def count_micro_batches(lengths: list[int], max_tokens: int) -> int:
    """Micro-batches first-fit-decreasing needs to keep each under ``max_tokens``."""
    return len(_first_fit_decreasing(lengths, max_tokens))


def plan_micro_batches(lengths: list[int], max_tokens: int, count: int) -> list[list[int]]:
    """Split row indices into exactly ``count`` micro-batches of at most ``max_tokens``.

    Every rank must run the same number of forwards (each one gathers parameters
    collectively), so ``count`` is the largest need over the ranks, capped by the
    fewest rows any rank has. First-fit-decreasing bins are split, heaviest first,
    until there are ``count``; only when the cap bites are the lightest bins merged
    (over the budget). A row longer than ``max_tokens`` gets a micro-batch of its own.
    """
    if not 1 <= count <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} rows into {count} micro-batches")
    bins = _first_fit_decreasing(lengths, max_tokens)
    while len(bins) > count:  # only when the caller asks for fewer bins than needed
        bins.sort(key=lambda b: sum(lengths[i] for i in b))
        bins[1].extend(bins.pop(0))
    while len(bins) < count:
        splittable = [b for b in bins if len(b) > 1]
        heaviest = max(splittable, key=lambda b: sum(lengths[i] for i in b))
        bins.remove(heaviest)
        heaviest.sort(key=lambda i: -lengths[i])
        halves: list[list[int]] = [[], []]
        loads = [0, 0]
        for i in heaviest:
            side = 0 if loads[0] <= loads[1] else 1
            halves[side].append(i)
            loads[side] += lengths[i]
        bins.extend(halves)
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def _first_fit_decreasing(lengths: list[int], max_tokens: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


@dataclass(frozen=True)
class PackedRows:
    """Rows packed into one sequence, and where each computed output belongs.

    ``output_index`` are the packed positions whose next token is a response token;
    the model's per-token output at ``output_index[k]`` (e.g. the log-prob of
    ``target_ids[k]``) goes to row ``dest_row[k]``, response column ``dest_col[k]``.
    """

    input_ids: Tensor  # [1, N]
    position_ids: Tensor  # [1, N]
    output_index: Tensor  # [M]
    target_ids: Tensor  # [M]
    dest_row: Tensor  # [M]
    dest_col: Tensor  # [M]
    cu_seq_lens: Tensor  # [rows + 1] int32: where each row's tokens start, then N
    num_rows: int
    response_width: int
    spans: tuple[tuple[int, int], ...]  # (start, end) of each non-empty row, on the host

    def to(self, device: torch.device) -> PackedRows:
        """The same packing with its tensors on ``device``."""
        return PackedRows(
            *(getattr(self, f).to(device) for f in _TENSOR_FIELDS),
            num_rows=self.num_rows,
            response_width=self.response_width,
            spans=self.spans,
        )

    def attention_kwargs(self) -> dict[str, Tensor | int]:
        """The rows' spans as the model forward's variable-length attention keywords
        (read by ``packed_sdpa`` and flash-attention; other kernels use the mask that
        ``position_ids`` imply). ``packed_spans`` gives ``packed_sdpa`` the spans as host
        integers, so no layer reads ``cu_seq_lens`` back from the device."""
        longest = max((end - start for start, end in self.spans), default=0)
        return {
            "packed_spans": self.spans,
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": longest,
            "max_length_k": longest,
        }

    def scatter(self, values: Tensor) -> Tensor:
        """Per-output ``values [M]`` as a response-aligned ``[rows, R]`` tensor (0 elsewhere)."""
        out = values.new_zeros(self.num_rows, self.response_width)
        return out.index_put((self.dest_row, self.dest_col), values)


_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "output_index",
    "target_ids",
    "dest_row",
    "dest_col",
    "cu_seq_lens",
)


def pack_rows(input_ids: Tensor, attention_mask: Tensor, response_width: int) -> PackedRows:
    """Pack the real tokens of each row of ``input_ids [b, L]`` into one ``[1, N]`` row.

    A response token (column ``>= L - response_width``) gets an output at the packed
    position of the real token before it; a response token with no real token before
    it in its row has no output (0 after :meth:`PackedRows.scatter`).
    """
    width = input_ids.shape[1]
    start = width - response_width
    ids, positions, out_index, targets, rows, cols = [], [], [], [], [], []
    offset, starts = 0, [0]
    for row in range(input_ids.shape[0]):
        real = attention_mask[row].nonzero().squeeze(1)
        n = int(real.numel())
        ids.append(input_ids[row, real])
        positions.append(torch.arange(n))
        # real[j] is a response column with a real token before it (j >= 1).
        j = (real >= start).nonzero().squeeze(1)
        j = j[j >= 1]
        out_index.append(offset + j - 1)
        targets.append(input_ids[row, real[j]])
        rows.append(torch.full_like(j, row))
        cols.append(real[j] - start)
        offset += n
        starts.append(offset)
    return PackedRows(
        input_ids=torch.cat(ids).unsqueeze(0),
        position_ids=torch.cat(positions).unsqueeze(0),
        output_index=torch.cat(out_index),
        target_ids=torch.cat(targets),
        dest_row=torch.cat(rows),
        dest_col=torch.cat(cols),
        cu_seq_lens=torch.tensor(starts, dtype=torch.int32),
        num_rows=input_ids.shape[0],
        response_width=response_width,
        spans=tuple((s, e) for s, e in pairwise(starts) if e > s),
    )
