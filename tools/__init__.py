"""Tools agents can call (OpenAI function-calling schema), built-in tools and the sandbox."""

from agentrl.tools.base import BaseTool, ToolArgumentError, ToolResponse
from agentrl.tools.decorator import FunctionTool, function_schema, tool
from agentrl.tools.loader import ToolSpec, import_object, load_tools
from agentrl.tools.render import (
    place_tools,
    template_supports_tools,
    tools_for_chat_template,
    tools_system_prompt,
    with_tools_system_prompt,
)
from agentrl.tools.schema import (
    FunctionCall,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
)

__all__ = [
    "BaseTool",
    "FunctionCall",
    "FunctionTool",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "ToolArgumentError",
    "ToolResponse",
    "ToolSpec",
    "function_schema",
    "import_object",
    "load_tools",
    "place_tools",
    "template_supports_tools",
    "tool",
    "tools_for_chat_template",
    "tools_system_prompt",
    "with_tools_system_prompt",
]
