"""Chat messages as the chat template sees them, and as the session recorder compares them.

Two views of one message:

- ``template_message``: the dict handed to ``apply_chat_template`` (text content, tool-call
  arguments as objects, ``developer`` as ``system``).
- ``message_key``: a canonical string used to decide whether a request repeats an earlier
  conversation. It ignores what clients rewrite when they echo a reply back (tool-call
  ids, JSON formatting of arguments, surrounding whitespace, ``None`` vs ``""`` content),
  but not the reasoning: a reply echoed without the reasoning the model wrote is not what
  the model saw, so it continues nothing (the session records a divergence).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.server.gateway.protocol import ChatMessage, ToolSpec


def _arguments_object(arguments: str | dict[str, Any]) -> Any:
    """Tool-call arguments as an object when they are a JSON object string."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def template_message(message: ChatMessage) -> dict[str, Any]:
    """The dict a chat template renders for ``message``."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments_object(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    reasoning = message.reasoning_text()
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def message_key(message: dict[str, Any]) -> str:
    """Canonical form of a template message, for prefix comparison."""
    calls = [
        [call["function"]["name"], call["function"]["arguments"]]
        for call in message.get("tool_calls") or ()
    ]
    canonical = [
        message["role"],
        (message.get("content") or "").strip(),
        calls,
        message.get("tool_call_id"),
        message.get("name"),
        (message.get("reasoning_content") or "").strip(),
    ]
    return json.dumps(canonical, sort_keys=True, ensure_ascii=False)


def tools_key(tools: list[ToolSpec] | None) -> str:
    """Canonical form of a request's tools (they are part of the rendered prompt)."""
    return json.dumps(template_tools(tools), sort_keys=True, ensure_ascii=False)


def template_tools(tools: list[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """The request's tools as plain dicts for the template's ``tools=`` argument."""
    if not tools:
        return None
    return [tool.model_dump(mode="json", exclude_none=True) for tool in tools]
