"""Reasoning parsers: one model turn's text → its reasoning and the rest (the content).

Reasoning models (Qwen3, DeepSeek-R1, gpt-oss, ...) write a chain of thought before the
answer or the tool calls. The agent loops keep every sampled token in the trajectory;
this split only decides what is parsed for tool calls (the content) and what the gateway
returns as ``reasoning_content``. A name resolves to a parser registered here (built in:
``harmony``, gpt-oss's analysis channel, ``agentrl.tools.harmony``; plugins add more with
``@register_reasoning_parser``), else to the installed vLLM's (``vllm:NAME`` always means
vLLM's; ``agentrl.tools.vllm_parsers``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "ReasoningParser",
    "ReasoningSplit",
    "get_reasoning_parser",
    "register_reasoning_parser",
]

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


_REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}


def register_reasoning_parser(
    name: str,
) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    """Class decorator: make a reasoning parser (built with the tokenizer) available as
    ``name``."""

    def decorate(cls: type[ReasoningParser]) -> type[ReasoningParser]:
        _REASONING_PARSERS[name] = cls
        return cls

    return decorate


def get_reasoning_parser(name: str | None, tokenizer: Any) -> ReasoningParser | None:
    """The reasoning parser registered as ``name`` here, else the one the installed vLLM
    registers (a ``vllm:`` prefix always means vLLM's); None for no name (the turn is all
    content)."""
    if not name:
        return None
    from agentrl.tools.parsers import load_builtin_parsers

    load_builtin_parsers()
    if name in _REASONING_PARSERS:
        return _REASONING_PARSERS[name](tokenizer)
    from agentrl.tools.vllm_parsers import VLLMReasoningParser

    return VLLMReasoningParser(name.removeprefix(VLLM_PREFIX), tokenizer)
