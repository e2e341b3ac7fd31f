"""Render a tool list for the model: ``tools=`` of a chat template, or a system prompt.

``tools_system_prompt`` writes Hermes-style instructions (the format Qwen2.5
templates use) for chat templates that ignore ``tools=``, e.g. SmolLM2's; the
model answers with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The rule, shared by the agent loops and the HTTP gateway, is ``place_tools``: tools go
to the template's ``tools=`` when ``template_supports_tools`` (or the caller says so),
else ``with_tools_system_prompt`` puts the instructions into the conversation's system
message. Both take the choice and the instructions' text from the same settings
(``rollout.tools_in_system_prompt``, ``rollout.tools_prompt_template``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.tools.base import BaseTool
from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = [
    "place_tools",
    "template_supports_tools",
    "tools_for_chat_template",
    "tools_system_prompt",
    "with_tools_system_prompt",
]

ToolList = (
    Mapping[str, BaseTool] | Iterable[BaseTool | OpenAIFunctionToolSchema | Mapping[str, Any]]
)

_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def tools_for_chat_template(tools: ToolList) -> list[dict[str, Any]]:
    """The OpenAI-format dicts for ``tokenizer.apply_chat_template(..., tools=...)``
    (plain dicts, e.g. an HTTP request's ``tools``, pass through)."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    return [_schema_dict(item) for item in items]


def _schema_dict(item: BaseTool | OpenAIFunctionToolSchema | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(item, BaseTool):
        return item.tool_schema.to_dict()
    if isinstance(item, OpenAIFunctionToolSchema):
        return item.to_dict()
    return dict(item)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` argument at all."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def tools_system_prompt(tools: ToolList, template: str | None = None) -> str:
    """Tool instructions with each schema as one JSON line.

    ``template`` is a format string with a ``{tools}`` field (literal braces doubled);
    None gives Hermes-style instructions with the schemas inside ``<tools>``.
    """
    lines = (json.dumps(schema, ensure_ascii=False) for schema in tools_for_chat_template(tools))
    return (template or _PROMPT).format(tools="\n".join(lines))


def place_tools(
    tokenizer: Any,
    tools: ToolList | None,
    in_system_prompt: bool | None = None,
    prompt_template: str | None = None,
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Where ``tools`` go for ``tokenizer``'s chat template: ``(schemas for the template's
    tools=, tools system prompt)``, one of them None (both without tools).

    ``in_system_prompt``: True = always the system prompt, False = always ``tools=``,
    None = the system prompt only when the template ignores ``tools=``.
    ``prompt_template``: the system prompt's format string (see ``tools_system_prompt``).
    """
    schemas = tools_for_chat_template(tools or [])
    if not schemas:
        return None, None
    if in_system_prompt is None:
        in_system_prompt = not template_supports_tools(tokenizer)
    if in_system_prompt:
        return None, tools_system_prompt(schemas, prompt_template)
    return schemas, None


def with_tools_system_prompt(
    messages: list[dict[str, Any]], prompt: str | None
) -> list[dict[str, Any]]:
    """``messages`` with ``prompt`` (a ``tools_system_prompt``) in the system message:
    appended after a blank line to a leading system message, else a new one first."""
    if not prompt:
        return messages
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{prompt}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
