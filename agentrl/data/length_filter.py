"""Drop prompts that are too long once the chat template is applied.

Lengths are computed once, when the dataset is built: each prompt is rendered with the
tokenizer's chat template (with the generation prompt, and the tool schemas when the agent
will show them) and tokenised in chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl.data.row import DatasetRow

__all__ = ["ChatTokenizer", "LengthFilterReport", "filter_long_prompts", "prompt_lengths"]

logger = logging.getLogger(__name__)

_CHUNK = 256


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the filter uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class LengthFilterReport:
    """What the length filter did: rows in, rows kept, rows dropped, the limit and the
    longest prompt seen (in tokens)."""

    total: int
    kept: int
    dropped: int
    max_prompt_length: int
    longest: int


def prompt_lengths(
    rows: Sequence[DatasetRow],
    tokenizer: ChatTokenizer,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token count of every row's prompt rendered with the chat template."""
    lengths: list[int] = []
    for start in range(0, len(rows), _CHUNK):
        texts = [
            tokenizer.apply_chat_template(
                row.messages(), tools=tools, add_generation_prompt=True, tokenize=False
            )
            for row in rows[start : start + _CHUNK]
        ]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths.extend(len(ids) for ids in encoded)
    return lengths


def filter_long_prompts(
    rows: Sequence[DatasetRow],
    tokenizer: ChatTokenizer,
    max_prompt_length: int,
    tools: list[dict[str, Any]] | None = None,
    name: str = "dataset",
) -> tuple[list[DatasetRow], LengthFilterReport]:
    """Keep rows whose templated prompt has at most ``max_prompt_length`` tokens.

    Logs the dropped count under ``name``; returns the kept rows (order preserved) and a
    report.
    """
    lengths = prompt_lengths(rows, tokenizer, tools)
    kept = [row for row, n in zip(rows, lengths, strict=True) if n <= max_prompt_length]
    report = LengthFilterReport(
        total=len(rows),
        kept=len(kept),
        dropped=len(rows) - len(kept),
        max_prompt_length=max_prompt_length,
        longest=max(lengths, default=0),
    )
    logger.info(
        "%s: dropped %d of %d prompts longer than %d tokens (longest %d)",
        name,
        report.dropped,
        report.total,
        max_prompt_length,
        report.longest,
    )
    return kept, report
