"""A chat reply's parts: reasoning, content and tool calls, parsed as the agent loops do.

The model's ids are decoded with special tokens kept (many families mark their call and
reasoning tags special: Qwen3.5's ``<tool_call>``, Mistral's ``[TOOL_CALLS]``), split by
the reasoning parser, and parsed for calls by the tool-call parser; the client then sees
each part without special tokens. The ids themselves are recorded untouched.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.parsers import ToolCallParser, get_tool_parser
from agentrl.tools.reasoning import get_reasoning_parser
from agentrl.tools.schema import FunctionCall

_MAX_TOOL_LISTS = 256


@dataclass
class Reply:
    """One choice's parts. ``content`` None: the reply is the plain decoded text."""

    content: str | None
    reasoning: str | None = None
    calls: list[FunctionCall] = field(default_factory=list)
    malformed_calls: int = 0


class ReplyParser:
    """Parses generated ids into a ``Reply`` with the configured parsers."""

    def __init__(self, tokenizer: Any, tool_parser: str, reasoning_parser: str | None) -> None:
        self._tokenizer = tokenizer
        self._tool_parser = tool_parser
        self._reasoning = get_reasoning_parser(reasoning_parser, tokenizer)
        self._by_tools: OrderedDict[str, ToolCallParser] = OrderedDict()
        specials = set(tokenizer.all_special_tokens) | {
            added.content
            for added in getattr(tokenizer, "added_tokens_decoder", {}).values()
            if added.special
        }
        # Longest first, so a special token containing another is removed whole.
        self._specials = sorted(specials, key=len, reverse=True)
        self._parser_for(None)  # an unknown parser name fails at start-up

    def _parser_for(self, tools: list[dict[str, Any]] | None) -> ToolCallParser:
        key = json.dumps(tools, sort_keys=True)
        parser = self._by_tools.get(key)
        if parser is None:
            parser = get_tool_parser(self._tool_parser, self._tokenizer, tools)
            if parser.stateless:
                self._by_tools[key] = parser
                if len(self._by_tools) > _MAX_TOOL_LISTS:
                    self._by_tools.popitem(last=False)
        else:
            self._by_tools.move_to_end(key)
        return parser

    def _visible(self, text: str) -> str:
        for special in self._specials:
            text = text.replace(special, "")
        return text

    def parse(
        self, ids: list[int], tools: list[dict[str, Any]] | None, parse_calls: bool
    ) -> Reply | None:
        """The reply's parts; None when there is nothing to parse (no reasoning parser,
        no tool calls wanted): the client gets the plain decoded text."""
        if self._reasoning is None and not parse_calls:
            return None
        text = self._tokenizer.decode(ids, skip_special_tokens=False)
        reply = Reply(content=None)
        if self._reasoning is not None:
            reasoning, text = self._reasoning.split(text)
            reply.reasoning = None if reasoning is None else self._visible(reasoning).strip()
            reply.content = self._visible(text).strip()
        if parse_calls:
            parsed = self._parser_for(tools).parse(text)
            reply.malformed_calls = len(parsed.errors)
            if parsed.calls:
                reply.calls = parsed.calls
                reply.content = self._visible(parsed.content).strip()
        return reply
