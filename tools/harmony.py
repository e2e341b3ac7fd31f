"""OpenAI's Harmony format (gpt-oss): a tool-call parser and a reasoning parser, built in.

A Harmony turn is a run of messages, each ``<|channel|>CHANNEL[ to=RECIPIENT][
<|constrain|>TYPE]<|message|>BODY`` closed by ``<|end|>``, ``<|call|>`` or ``<|return|>``;
every message after the first starts ``<|start|>assistant`` (the generation prompt wrote
the first one's). Reasoning is on the ``analysis`` channel; a call is a message to
``functions.NAME`` whose body is the JSON arguments, and it ends the turn with
``<|call|>``; the answer is on ``final`` and ends the turn with ``<|return|>``. Both are
stop tokens (``HarmonyToolParser.end_of_turn_tokens``): the engine stops at each call.

vLLM parses Harmony from token ids with ``openai_harmony`` (its ``openai`` tool parser
and ``openai_gptoss`` reasoning parser are stubs that refuse text). These parse the
decoded text of one turn (special tokens kept) with a strict grammar, and need neither
vLLM nor ``openai_harmony``. The recipient may also come before the channel, as older
Harmony renders wrote it (``to=functions.NAME<|channel|>commentary json``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentrl.tools.parsers import ParsedTurn, ToolCallParser, register_tool_parser
from agentrl.tools.reasoning import ReasoningParser, ReasoningSplit, register_reasoning_parser
from agentrl.tools.schema import FunctionCall

__all__ = ["HarmonyReasoningParser", "HarmonyToolParser", "split_messages"]

_START = "<|start|>"
_MESSAGE = "<|message|>"
_CHANNEL = "<|channel|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_FUNCTIONS = "functions."


@dataclass
class HarmonyMessage:
    """One message of a turn; ``header`` None for plain text outside any message."""

    header: str | None
    body: str
    raw: str
    closed: bool = True

    @property
    def channel(self) -> str | None:
        if self.header is None or _CHANNEL not in self.header:
            return None
        rest = self.header.split(_CHANNEL, 1)[1].strip()
        return rest.split()[0] if rest.split() else ""

    @property
    def recipient(self) -> str | None:
        match = None if self.header is None else _RECIPIENT.search(self.header)
        return match.group(1) if match else None


def split_messages(text: str) -> list[HarmonyMessage]:
    """``text`` as Harmony messages, with plain text (no header) as header-less pieces."""
    messages: list[HarmonyMessage] = []
    for index, piece in enumerate(text.split(_START)):
        raw = piece if index == 0 else _START + piece
        if index > 0:
            piece = piece.removeprefix("assistant")
        if not piece.lstrip().startswith((_CHANNEL, "to=")):
            if piece:
                messages.append(HarmonyMessage(None, piece, raw))
            continue
        if _MESSAGE not in piece:  # the header was never finished
            messages.append(HarmonyMessage(piece, "", raw, closed=False))
            continue
        header, body = piece.split(_MESSAGE, 1)
        closed = body.rstrip().endswith(_ENDS)
        for end in _ENDS if closed else ():
            if body.rstrip().endswith(end):
                body = body.rstrip()[: -len(end)]
                break
        messages.append(HarmonyMessage(header, body, raw, closed))
    return messages


@register_tool_parser("harmony")
class HarmonyToolParser(ToolCallParser):
    """Calls to ``functions.NAME`` with JSON arguments; the content is the text of the
    other messages (a ``commentary`` preamble, the ``final`` answer), analysis left out.

    A call whose arguments are not a JSON object, whose header never reaches
    ``<|message|>``, or whose recipient is not in ``functions`` is an error."""

    stateless = True
    end_of_turn_tokens = ("<|call|>", "<|return|>")

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn(content="")
        content: list[str] = []
        for message in split_messages(text):
            recipient = message.recipient
            if recipient is None:
                if message.header is None or message.channel != "analysis":
                    content.append(message.body)
                continue
            index = turn.attempted_calls + 1
            if not recipient.startswith(_FUNCTIONS) or recipient == _FUNCTIONS:
                turn.errors.append(
                    f"tool call {index}: unknown recipient {recipient!r} (call a function "
                    "as to=functions.NAME)"
                )
                continue
            name = recipient.removeprefix(_FUNCTIONS)
            if message.header is not None and _MESSAGE not in message.raw:
                turn.errors.append(
                    f"tool call {index} ({name}): the header never reached <|message|>"
                )
                continue
            self._add_call(name, message.body, index, turn)
        turn.content = "\n".join(part.strip() for part in content if part.strip())
        return turn

    def turn_message(self, text: str, reasoning: str | None) -> dict[str, Any]:
        """A turn with calls as an OpenAI message: the other messages' text as
        ``content`` (a ``commentary`` preamble), each call in ``tool_calls`` with its
        arguments as the model wrote them. The Harmony template writes calls only from
        ``tool_calls`` (content becomes a ``final`` message), so a re-render of the
        verbatim text would not be the turn the model sampled. A turn without calls, or
        with a call to something other than a function, is kept verbatim."""
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        for message in split_messages(text):
            recipient = message.recipient
            if recipient is None:
                content.append(message.body)
            elif recipient.startswith(_FUNCTIONS) and recipient != _FUNCTIONS:
                function = {"name": recipient.removeprefix(_FUNCTIONS), "arguments": message.body}
                calls.append({"type": "function", "function": function})
            else:
                calls = []
                break
        if not calls:
            return super().turn_message(text, reasoning)
        kept = super().turn_message("".join(content), reasoning)
        kept["tool_calls"] = calls
        return kept

    @staticmethod
    def _add_call(name: str, body: str, index: int, turn: ParsedTurn) -> None:
        try:
            arguments = json.loads(body) if body.strip() else {}
        except json.JSONDecodeError as exc:
            turn.errors.append(
                f"tool call {index} ({name}): invalid JSON arguments ({exc.msg} at char {exc.pos})"
            )
            return
        if not isinstance(arguments, dict):
            turn.errors.append(f"tool call {index} ({name}): arguments must be a JSON object")
            return
        turn.calls.append(FunctionCall(name=name, arguments=arguments))


@register_reasoning_parser("harmony")
class HarmonyReasoningParser(ReasoningParser):
    """The ``analysis`` messages are the reasoning (joined by newlines; None if the turn
    has none). The content keeps each call message as written, for the tool parser, and
    the other messages as their text alone."""

    def __init__(self, tokenizer: object = None) -> None:
        del tokenizer  # the grammar is text; the tokenizer is not needed

    def split(self, text: str) -> ReasoningSplit:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[str] = []
        for message in split_messages(text):
            if message.channel == "analysis" and message.recipient is None:
                reasoning.append(message.body)
            elif message.recipient is not None:
                calls.append(message.raw)
            else:
                content.append(message.body)
        return ReasoningSplit(
            reasoning="\n".join(reasoning) if reasoning else None,
            content="\n".join(content) + "".join(calls),
        )
