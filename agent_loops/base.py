"""``AgentLoopBase``: the one class users subclass to define how an episode runs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.output import AgentLoopOutput
from agentrl.config import RolloutConfig
from agentrl.server.types import SamplingParams, TokenOutput
from agentrl.tools import BaseTool
from agentrl.tools.parsers import ToolCallParser


class GenerateClient(Protocol):
    """What a loop needs from the rollout servers (``ServerClient`` implements it)."""

    async def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None = None
    ) -> TokenOutput: ...


@dataclass
class AgentLoopContext:
    """Everything one episode's loop gets from the worker that runs it."""

    client: GenerateClient
    tokenizer: Any
    renderer: ChatRenderer
    tools: dict[str, BaseTool]
    tool_parser: ToolCallParser
    config: RolloutConfig
    session_id: str
    metrics: dict[str, float] = field(default_factory=dict)


class AgentLoopBase(ABC):
    """One instance per episode. Implement ``run``; use the helpers below.

    ``self.generate`` sends every turn with the episode's session id, so all turns of an
    episode land on the same rollout replica and reuse its KV cache.
    """

    def __init__(self, context: AgentLoopContext) -> None:
        self.context = context

    @property
    def tokenizer(self) -> Any:
        return self.context.tokenizer

    @property
    def tools(self) -> dict[str, BaseTool]:
        return self.context.tools

    @property
    def config(self) -> RolloutConfig:
        return self.context.config

    @property
    def renderer(self) -> ChatRenderer:
        return self.context.renderer

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> TokenOutput:
        """One model turn on this episode's replica."""
        return await self.context.client.generate(self.context.session_id, prompt_ids, sampling)

    async def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt ids for ``messages`` (with the tools), rendered off the event loop."""
        return await self.renderer.encode_prompt(messages)

    def turn_sampling(self, sampling: SamplingParams, budget: int) -> SamplingParams:
        """``sampling`` with ``max_tokens`` capped by the remaining response budget."""
        return replace(sampling, max_tokens=max(1, min(sampling.max_tokens, budget)))

    @abstractmethod
    async def run(
        self, sample: dict[str, Any], sampling: SamplingParams
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run one episode of ``sample`` (a dataset row); return its training sample(s)."""
