"""Build an ``AgentLoopContext`` for running one agent loop in-process (tests, examples)."""

from __future__ import annotations

import uuid
from typing import Any

from agentrl.agent_loops.base import AgentLoopContext, GenerateClient
from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.config import RolloutConfig
from agentrl.tools import BaseTool
from agentrl.tools.parsers import get_tool_parser
from agentrl.tools.reasoning import get_reasoning_parser


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
    schemas = [t.tool_schema.to_dict() for t in tools.values()]
    return AgentLoopContext(
        client=client,
        tokenizer=tokenizer,
        renderer=ChatRenderer(tokenizer, schemas),
        tools=tools,
        tool_parser=get_tool_parser(config.tool_parser, tokenizer, schemas),
        config=config,
        session_id=session_id or f"ep-{uuid.uuid4().hex}",
        reasoning_parser=get_reasoning_parser(config.reasoning_parser, tokenizer),
    )
