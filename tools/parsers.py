"""Tool-call parsers: model output text of one turn → function calls, behind a registry.

Both the agent loops and the HTTP gateway parse model output with these, so a model's
tool calls mean the same thing wherever it runs. A name resolves to a parser registered
here (built in, needing no vLLM: ``hermes``, and ``harmony`` for gpt-oss in
``agentrl.tools.harmony``; plugins add more with ``@register_tool_parser``), else to the
tool-call parser the installed vLLM registers under that name (``llama3_json``,
``mistral``, ``qwen3_coder``, ...); ``vllm:NAME`` always means vLLM's.
"""

from __future__ import annotations

import functools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agentrl.tools.schema import FunctionCall


@dataclass
class ParsedTurn:
    """One model turn split into plain content, valid calls and malformed-call errors.

    ``errors[i]`` describes a call block the model attempted but got wrong (bad JSON,
    missing name, unterminated tag); the loop answers each with an error message.
    """

    content: str
    calls: list[FunctionCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def attempted_calls(self) -> int:
        return len(self.calls) + len(self.errors)


class ToolCallParser(ABC):
    """Parses the decoded text of one model turn.

    ``stateless``: ``parse`` keeps no state between turns, so one instance may serve
    every episode of a process (otherwise each episode gets its own).
    """

    stateless: bool = False
    # Tokens besides the tokenizer's eos that end a model turn in this format (the
    # engine stops at them): Harmony ends a turn with <|call|> or <|return|>.
    end_of_turn_tokens: tuple[str, ...] = ()

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Split ``text`` (the new turn only) into content, calls and errors."""

    def turn_message(self, text: str, reasoning: str | None) -> dict[str, Any]:
        """The turn as the chat message the loop keeps (``rollout.keep_messages``, the
        drift check): ``text`` (the turn after its reasoning) verbatim, call blocks
        included, so a template that echoes an assistant's content renders exactly what
        the model sampled, and the reasoning, if any, as ``reasoning_content``. A format
        whose template writes calls only from ``tool_calls`` overrides this."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message


_PARSERS: dict[str, type[ToolCallParser]] = {}


def register_tool_parser(name: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """Class decorator: make a parser available under ``name``."""

    def decorate(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        _PARSERS[name] = cls
        return cls

    return decorate


def get_tool_parser(
    name: str, tokenizer: Any = None, tools: list[dict[str, Any]] | None = None
) -> ToolCallParser:
    """A new instance of the parser registered as ``name``, here or in the installed vLLM.

    vLLM's parsers need the model's ``tokenizer``; ``tools`` (OpenAI tool dicts) are the
    schemas some formats convert argument values with.
    """
    load_builtin_parsers()
    if name in _PARSERS:
        return _PARSERS[name]()
    from agentrl.tools.reasoning import VLLM_PREFIX
    from agentrl.tools.vllm_parsers import UnknownParser, VLLMToolCallParser

    try:
        return VLLMToolCallParser(name.removeprefix(VLLM_PREFIX), tokenizer, tools)
    except ImportError:
        raise ValueError(
            f"unknown tool parser {name!r}; built in: {sorted(_PARSERS)} (vLLM, which "
            "registers parsers for most model families, is not installed)"
        ) from None
    except UnknownParser as exc:
        raise ValueError(f"{exc}; built in: {sorted(_PARSERS)}") from None


@functools.cache
def load_builtin_parsers() -> None:
    """Register the built-in parsers kept in their own modules (Harmony's), once."""
    import agentrl.tools.harmony  # noqa: F401  (registers `harmony`)


@functools.cache
def _block_pattern(open_tag: str, close_tag: str) -> re.Pattern[str]:
    # Parsers are built once per episode; compiling (even through re's cache) is not free.
    return re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)


@register_tool_parser("hermes")
class HermesToolParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen, Hermes)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    stateless = True

    def __init__(self) -> None:
        self._block = _block_pattern(self.open_tag, self.close_tag)

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn(content="")
        pieces: list[str] = []
        position = 0
        for index, match in enumerate(self._block.finditer(text), start=1):
            pieces.append(text[position : match.start()])
            position = match.end()
            self._parse_block(match.group(1), index, turn)
        tail = text[position:]
        if self.open_tag in tail:
            before, _, _ = tail.partition(self.open_tag)
            pieces.append(before)
            turn.errors.append(
                f"tool call {turn.attempted_calls + 1}: `{self.open_tag}` was never closed "
                f"with `{self.close_tag}`"
            )
        else:
            pieces.append(tail)
        turn.content = "".join(pieces).strip()
        return turn

    @staticmethod
    def _parse_block(body: str, index: int, turn: ParsedTurn) -> None:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            turn.errors.append(f"tool call {index}: invalid JSON ({exc.msg} at char {exc.pos})")
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            turn.errors.append(
                f'tool call {index}: expected {{"name": <string>, "arguments": <object>}}, '
                f"got {body.strip()[:200]}"
            )
            return
        try:
            turn.calls.append(
                FunctionCall(name=payload["name"], arguments=payload.get("arguments") or {})
            )
        except ValidationError as exc:
            turn.errors.append(
                f"tool call {index} ({payload['name']}): arguments must be a JSON object "
                f"({exc.errors()[0]['msg']})"
            )
