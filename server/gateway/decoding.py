"""Turning engine token ids into reply text: special tokens, stop strings, logprob tokens."""

from __future__ import annotations

from typing import Any


def visible_text(tokenizer: Any, ids: list[int]) -> str:
    """The text a client sees for ``ids`` (special tokens such as end-of-turn dropped)."""
    return tokenizer.decode(ids, skip_special_tokens=True)


def cut_at_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[list[int], str] | None:
    """Apply OpenAI ``stop`` strings after generation.

    Returns ``(kept_ids, text)``: ``text`` ends right before the earliest stop string, and
    ``kept_ids`` run through the token that completed it (the tokens the model actually
    produced, so the trajectory stays token-exact). None if no stop string occurs.
    """
    text = visible_text(tokenizer, ids)
    hits = [(text.find(stop), stop) for stop in stops if stop in text]
    if not hits:
        return None
    position, stop = min(hits)
    # Smallest prefix of ids whose text contains the whole stop string (binary search:
    # containment only grows with the prefix).
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        if stop in visible_text(tokenizer, ids[:mid]):
            high = mid
        else:
            low = mid + 1
    return ids[:low], text[:position]


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's own text (for logprobs entries)."""
    return [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
