"""vLLM's maintained tool-call and reasoning parsers behind agentrl's parser interfaces.

The installed vLLM registers a parser per model family (``hermes``, ``llama3_json``,
``mistral``, ``qwen3_coder``, ``deepseek_v3``, ...; reasoning: ``qwen3``,
``deepseek_r1``, ...). These adapters call their non-streaming ``extract_*`` methods on
one finished turn. vLLM is imported only when such a parser is asked for: the parser
modules, never the engine, and none of it for the built-in Hermes parser.

vLLM's tool parsers return no calls at all when a call block is malformed (the whole turn
comes back as content). An agent loop must still answer every attempted call, so the
adapter counts the family's call-start markers in the text and reports each call it
could not recover as an error, as the built-in parser does.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agentrl.tools.parsers import ParsedTurn, ToolCallParser
from agentrl.tools.reasoning import ReasoningParser, ReasoningSplit
from agentrl.tools.schema import FunctionCall

__all__ = [
    "UnknownParser",
    "VLLMReasoningParser",
    "VLLMToolCallParser",
    "vllm_reasoning_parser_names",
    "vllm_tool_parser_names",
]

# Attributes vLLM's parsers use for the text that opens one call (or a list of calls),
# and for the text that closes one call.
_MARKER_ATTRIBUTES = ("tool_call_start_token", "tool_call_begin_token", "bot_token")
_END_ATTRIBUTE = "tool_call_end_token"
# Parsers that name no markers of their own (vLLM's engine-based adapters): (open, close).
_KNOWN_MARKERS = {
    "qwen3_coder": ("<tool_call>", "</tool_call>"),
    "qwen3_xml": ("<tool_call>", "</tool_call>"),
    "glm45": ("<tool_call>", "</tool_call>"),
    "glm47": ("<tool_call>", "</tool_call>"),
    "kimi_k2": ("<|tool_call_begin|>", "<|tool_call_end|>"),
    "gemma4": ("<|tool_call>", "<tool_call|>"),
    "minimax_m2": ("<invoke name=", "</invoke>"),
}
# Formats whose calls open with no marker of their own: a JSON object starting the turn.
_BARE_JSON_PARSERS = frozenset({"llama3_json", "llama4_json", "phi4_mini_json"})


def vllm_tool_parser_names() -> list[str]:
    """Names of the tool-call parsers the installed vLLM registers."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def vllm_reasoning_parser_names() -> list[str]:
    """Names of the reasoning parsers the installed vLLM registers."""
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.list_registered()


def _request(tools: list[dict[str, Any]] | None) -> Any:
    """The chat request vLLM's parsers read their tool schemas from."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="agentrl",
        messages=[{"role": "user", "content": ""}],
        tools=tools or None,
    )


class UnknownParser(ValueError):
    """The installed vLLM registers no parser of that name."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} parser {name!r}; the installed vLLM registers {known}")


class VLLMToolCallParser(ToolCallParser):
    """One of vLLM's registered tool-call parsers, parsing one finished turn.

    ``tools`` (OpenAI tool dicts) reach the parser as a request's ``tools``: some formats
    (Qwen3-Coder's XML) convert argument values with the tool's parameter schema.
    """

    stateless = True  # vLLM's non-streaming extraction keeps no state between turns

    def __init__(self, name: str, tokenizer: Any, tools: list[dict[str, Any]] | None = None):
        from vllm.tool_parsers import ToolParserManager

        if tokenizer is None:
            raise ValueError(f"vLLM's {name!r} tool parser needs the model's tokenizer")
        try:
            parser_cls = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise UnknownParser("tool", name, ToolParserManager.list_registered()) from None
        # vLLM logs a traceback for every call it cannot parse (from the parser's module, or
        # from the shared parser engine under vllm.parser for the newer ones); here each
        # one becomes an error message to the model and a `tool_calls/malformed` count.
        for logger_name in (parser_cls.__module__, "vllm.parser"):
            logging.getLogger(logger_name).setLevel(logging.CRITICAL)
        self.name = name
        self._request = _request(tools)
        self._parser = parser_cls(tokenizer, self._request.tools)
        self._markers, self._end = _call_markers(name, self._parser)

    def parse(self, text: str) -> ParsedTurn:
        info = self._parser.extract_tool_calls(text, self._request)
        turn = ParsedTurn(content=(info.content or "").strip() if info.tools_called else text)
        if info.tools_called:
            for call in info.tool_calls:
                # Most parsers make up an id per call; one the model wrote is kept.
                written_id = call.id if call.id and call.id in text else None
                self._add_call(call.function.name, call.function.arguments, written_id, turn)
        if self._end and text.count(self._end) < text.count(self._markers[0]) and turn.calls:
            # A lenient parser recovered a call the model never finished: the last one.
            turn.calls.pop()
            turn.errors.append(
                f"tool call {turn.attempted_calls + 1}: cut off before `{self._end}`"
            )
        missing = self._attempted(text) - turn.attempted_calls
        for _ in range(missing):
            turn.errors.append(
                f"tool call {turn.attempted_calls + 1}: not in the {self.name!r} tool-call "
                "format (check the call's syntax and that its arguments are valid JSON)"
            )
        if missing > 0 and not info.tools_called:
            turn.content = ""  # the text is a failed call, not an answer
        return turn

    @staticmethod
    def _add_call(name: str, arguments: str | None, call_id: str | None, turn: ParsedTurn) -> None:
        index = turn.attempted_calls + 1
        try:
            parsed = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError as exc:
            turn.errors.append(f"tool call {index} ({name}): invalid JSON arguments ({exc.msg})")
            return
        if not isinstance(parsed, dict):
            turn.errors.append(f"tool call {index} ({name}): arguments must be a JSON object")
            return
        turn.calls.append(FunctionCall(name=name, arguments=parsed, id=call_id))

    def _attempted(self, text: str) -> int:
        """How many calls the text opens, by the format's markers (0 if it has none)."""
        counts = [text.count(marker) for marker in self._markers]
        if self.name in _BARE_JSON_PARSERS and text.lstrip().startswith("{"):
            counts.append(1)
        return max(counts, default=0)


def _call_markers(name: str, parser: Any) -> tuple[list[str], str | None]:
    """The texts that open a call in this format, and the one that closes a call."""
    if name in _KNOWN_MARKERS:
        start, end = _KNOWN_MARKERS[name]
        return [start], end
    markers = (getattr(parser, attribute, None) for attribute in _MARKER_ATTRIBUTES)
    starts = [marker for marker in markers if isinstance(marker, str) and marker]
    end = getattr(parser, _END_ATTRIBUTE, None)
    return starts, end if starts and isinstance(end, str) and end else None


class VLLMReasoningParser(ReasoningParser):
    """One of vLLM's registered reasoning parsers, splitting one finished turn."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.reasoning import ReasoningParserManager

        if tokenizer is None:
            raise ValueError(f"vLLM's {name!r} reasoning parser needs the model's tokenizer")
        try:
            parser_cls = ReasoningParserManager.get_reasoning_parser(name)
        except KeyError:
            known = ReasoningParserManager.list_registered()
            raise UnknownParser("reasoning", name, known) from None
        self.name = name
        self._request = _request(None)
        self._parser = parser_cls(tokenizer)

    def split(self, text: str) -> ReasoningSplit:
        reasoning, content = self._parser.extract_reasoning(text, self._request)
        return ReasoningSplit(reasoning=reasoning, content=content or "")
