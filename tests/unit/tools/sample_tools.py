"""Tools importable by path from the loader tests."""

from __future__ import annotations

from typing import Any

from agentrl.tools import BaseTool, OpenAIFunctionToolSchema, ToolResponse, tool


class NeedsSchemaTool(BaseTool):
    """A tool with no default schema: YAML must give one."""

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        return ToolResponse(text=f"{self.config.get('prefix', '')}{parameters}"), 0.0, {}


class DefaultSchemaTool(NeedsSchemaTool):
    """The same tool with a default schema."""

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate({"function": {"name": "default_tool"}})


@tool
def shout(text: str) -> str:
    """Upper-case the text.

    Args:
        text: Words to shout.
    """
    return text.upper()


NOT_A_TOOL = 42
