"""Tool schemas shared by tests."""

from __future__ import annotations

from typing import Any

ADD_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
"""An ``add(a: int, b: int)`` function tool in OpenAI format."""
