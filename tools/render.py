"""Render a tool list for the model: ``tools=`` of a chat template, or a system prompt.

``tools_system_prompt`` writes Hermes-style instructions (the format Qwen2.5
templates use) for chat templates that ignore ``tools=``, e.g. SmolLM2's; the
model answers with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.tools.base import BaseTool
from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = ["tools_for_chat_template", "tools_system_prompt"]

ToolList = Mapping[str, BaseTool] | Iterable[BaseTool | OpenAIFunctionToolSchema]

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
    """The OpenAI-format dicts for ``tokenizer.apply_chat_template(..., tools=...)``."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    return [(item.tool_schema if isinstance(item, BaseTool) else item).to_dict() for item in items]


def tools_system_prompt(tools: ToolList, template: str | None = None) -> str:
    """Tool instructions with each schema as one JSON line.

    ``template`` is a format string with a ``{tools}`` field (literal braces doubled);
    None gives Hermes-style instructions with the schemas inside ``<tools>``.
    """
    lines = (json.dumps(schema, ensure_ascii=False) for schema in tools_for_chat_template(tools))
    return (template or _PROMPT).format(tools="\n".join(lines))
