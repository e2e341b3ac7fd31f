"""KV-cache bookkeeping for ``HFEngine``: prefill, a left-padded decode batch, a prefix cache.

A KV cache is handled as ``KV``: one ``(keys, values)`` pair per layer, each shaped
``[batch, kv_heads, seq_len, head_dim]``. Keys are stored after RoPE, so a sequence's cache
can be left-padded, stacked with others and sliced out again without recomputation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Generic, TypeVar

import torch
from transformers import DynamicCache, PreTrainedModel

KV = list[tuple[torch.Tensor, torch.Tensor]]
T = TypeVar("T")


def kv_length(kv: KV) -> int:
    """Number of positions held by ``kv``."""
    return kv[0][0].shape[-2] if kv else 0


def _kv_of(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - t.shape[-2]
    if missing == 0:
        return t
    pad = t.new_zeros((*t.shape[:-2], missing, t.shape[-1]))
    return torch.cat([pad, t], dim=-2)


def prefill(
    model: PreTrainedModel, prefix: KV | None, tokens: list[int]
) -> tuple[torch.Tensor, KV]:
    """Run ``tokens`` after the cached ``prefix`` (batch of one).

    Returns the logits ``(vocab,)`` at the last position and the KV of prefix + tokens.
    """
    cache = DynamicCache(prefix) if prefix else DynamicCache()
    ids = torch.tensor([tokens], device=model.device)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1], _kv_of(out.past_key_values)


class DecodeBatch(Generic[T]):
    """In-flight sequences decoded one token per step over one left-padded KV cache.

    Row ``i`` holds ``lengths[i]`` real positions, right-aligned; the positions before them
    are padding, masked out of attention. Each row gets its own position ids, so a row's
    result does not depend on the other rows.
    """

    def __init__(self) -> None:
        self.items: list[T] = []
        self._lengths: list[int] = []
        self._cache = DynamicCache()

    def clear(self) -> None:
        """Drop every row."""
        self.items, self._lengths, self._cache = [], [], DynamicCache()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def width(self) -> int:
        """Padded length of the shared cache."""
        return self._cache.get_seq_length() if self.items else 0

    def add(self, entries: list[tuple[T, KV]]) -> None:
        """Append rows: each item with the KV of everything before its next input token."""
        if not entries:
            return
        width = max([self.width] + [kv_length(kv) for _, kv in entries])
        parts = [_kv_of(self._cache)] if self.items else []
        parts += [kv for _, kv in entries]
        self._cache = DynamicCache(
            [
                tuple(torch.cat([_left_pad(p[layer][i], width) for p in parts]) for i in (0, 1))
                for layer in range(len(parts[0]))
            ]
        )
        self.items += [item for item, _ in entries]
        self._lengths += [kv_length(kv) for _, kv in entries]

    def remove(self, items: Collection[T]) -> list[tuple[T, KV]]:
        """Drop the rows of ``items``; return each with its own (unpadded, copied) KV."""
        rows = [i for i, item in enumerate(self.items) if item in items]
        if not rows:  # nothing to drop: keep the cache as it is (no copy)
            return []
        removed = [(self.items[i], self._row_kv(i)) for i in rows]
        keep = [i for i in range(len(self.items)) if i not in rows]
        if not keep:
            self.clear()
            return removed
        start = self.width - max(self._lengths[i] for i in keep)
        kv = _kv_of(self._cache)
        index = torch.tensor(keep, device=kv[0][0].device)  # on the cache's device
        self._cache = DynamicCache(
            [
                (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
                for k, v in kv
            ]
        )
        self.items = [self.items[i] for i in keep]
        self._lengths = [self._lengths[i] for i in keep]
        return removed

    def step(self, model: PreTrainedModel, input_ids: list[int]) -> torch.Tensor:
        """Feed one token per row (in row order); return the next-token logits ``(rows, vocab)``."""
        width = self.width
        mask = torch.zeros(len(self.items), width + 1, dtype=torch.long)
        for row, length in enumerate(self._lengths):
            mask[row, width - length :] = 1
        out = model(
            input_ids=torch.tensor(input_ids, device=model.device).unsqueeze(1),
            attention_mask=mask.to(model.device),
            position_ids=torch.tensor(self._lengths, device=model.device).unsqueeze(1),
            past_key_values=self._cache,
            use_cache=True,
        )
        self._lengths = [length + 1 for length in self._lengths]
        return out.logits[:, -1]

    def _row_kv(self, row: int) -> KV:
        start = self.width - self._lengths[row]
        return [
            (k[row : row + 1, :, start:].clone(), v[row : row + 1, :, start:].clone())
            for k, v in _kv_of(self._cache)
        ]


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


class PrefixCache:
    """LRU of past sequences' KV caches, looked up by longest common token prefix."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, KV]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def lookup(self, tokens: list[int], limit: int) -> tuple[int, KV | None]:
        """Longest cached prefix of ``tokens`` (at most ``limit`` long) and its KV (views)."""
        query = torch.tensor(tokens)
        best, best_key = 0, None
        for key, (ids, _) in self._entries.items():
            n = _common_prefix(ids, query)
            if n > best:
                best, best_key = n, key
        best = min(best, limit)
        if best_key is None or best == 0:
            return 0, None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key][1]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def store(self, tokens: list[int], kv: KV) -> None:
        """Remember ``kv`` (the KV of ``tokens``), replacing entries it extends."""
        if self.capacity == 0 or not tokens:
            return
        key = tuple(tokens)
        for other in list(self._entries):
            if other[: len(key)] == key:  # an entry already covers this sequence
                self._entries.move_to_end(other)
                return
            if key[: len(other)] == other:
                del self._entries[other]
        self._entries[key] = (torch.tensor(tokens), kv)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
