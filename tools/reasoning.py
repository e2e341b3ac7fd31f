"""Reasoning parsers: one model turn's text → its reasoning and the rest (the content).

Reasoning models (Qwen3, DeepSeek-R1, gpt-oss, ...) write a chain of thought before the
answer or the tool calls. The agent loops keep every sampled token in the trajectory;
this split only decides what is parsed for tool calls (the content) and what the gateway
returns as ``reasoning_content``. agentrl ships no reasoning parser of its own: the
names are the installed vLLM's (``agentrl.tools.vllm_parsers``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

__all__ = ["ReasoningParser", "ReasoningSplit", "get_reasoning_parser"]

VLLM_PREFIX = "vllm:"


class ReasoningSplit(NamedTuple):
    """A turn's reasoning (None if it wrote none) and its content."""

    reasoning: str | None
    content: str


class ReasoningParser(ABC):
    """Splits the decoded text of one finished model turn."""

    @abstractmethod
    def split(self, text: str) -> ReasoningSplit:
        """``text``'s reasoning and content."""


def get_reasoning_parser(name: str | None, tokenizer: Any) -> ReasoningParser | None:
    """The reasoning parser the installed vLLM registers as ``name`` (a ``vllm:`` prefix
    is accepted); None for no name (the turn is all content)."""
    if not name:
        return None
    from agentrl.tools.vllm_parsers import VLLMReasoningParser

    return VLLMReasoningParser(name.removeprefix(VLLM_PREFIX), tokenizer)
