"""Tools agents can call (OpenAI function-calling schema)."""

from agentrl.tools.base import BaseTool, ToolArgumentError, ToolResponse
from agentrl.tools.schema import (
    FunctionCall,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
)

__all__ = [
    "BaseTool",
    "FunctionCall",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "ToolArgumentError",
    "ToolResponse",
]
