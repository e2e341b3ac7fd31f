"""Build an ``AgentLoopContext`` for running one agent loop in-process (tests, examples)."""

from __future__ import annotations

import uuid
from typing import Any

from agentrl.agent_loops.base import AgentLoopContext, GenerateClient
from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.config import RolloutConfig
from agentrl.tools import BaseTool
from agentrl.tools.parsers import get_tool_parser


def loop_context(
    tokenizer: Any,
    client: GenerateClient | None = None,
    *,
    tools: dict[str, BaseTool] | None = None,
    config: RolloutConfig | None = None,
    session_id: str | None = None,
) -> AgentLoopContext:
    """A context whose renderer passes ``tools`` to the chat template's ``tools=``."""
    tools = tools or {}
    config = config or RolloutConfig()
    return AgentLoopContext(
        client=client,
        tokenizer=tokenizer,
        renderer=ChatRenderer(tokenizer, [t.tool_schema.to_dict() for t in tools.values()]),
        tools=tools,
        tool_parser=get_tool_parser(config.tool_parser),
        config=config,
        session_id=session_id or f"ep-{uuid.uuid4().hex}",
    )
