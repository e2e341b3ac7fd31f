"""``AgentLoopBase``: the one class users subclass to define how an episode runs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.config import RolloutConfig
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.tools import BaseTool
from agentrl.tools.parsers import ToolCallParser
from agentrl.tools.reasoning import ReasoningParser

if TYPE_CHECKING:
    from agentrl.agent_loops.conversation import Conversation

MAX_PARTIAL_RESUBMITS = 16


def join_outputs(first: TokenOutput, second: TokenOutput) -> TokenOutput:
    """``second`` continued ``first`` (sent with ``first``'s tokens appended to the prompt)."""
    return replace(
        second,
        token_ids=first.token_ids + second.token_ids,
        logprobs=first.logprobs + second.logprobs,
        token_versions=first.token_versions + second.token_versions,
        num_cached_tokens=first.num_cached_tokens,
        num_prompt_tokens=first.num_prompt_tokens,
    )


class GenerateClient(Protocol):
    """What a loop needs from the rollout servers (``DataClient`` implements it)."""

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
    reasoning_parser: ReasoningParser | None = None


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
        """One model turn on this episode's replica.

        A turn aborted by a weight swap (``pause(abort)``) is resubmitted with its partial
        tokens as prefix (partial rollout) and the pieces are joined, so nothing sampled is
        thrown away; each resubmission is counted in ``metrics["partial_rollouts"]``.
        """
        context = self.context
        out = await context.client.generate(context.session_id, prompt_ids, sampling)
        if out.finish_reason == "abort":
            out = await self._resume_partial(prompt_ids, sampling, out)
        return out

    async def _resume_partial(
        self, prompt_ids: list[int], sampling: SamplingParams, out: TokenOutput
    ) -> TokenOutput:
        client, session = self.context.client, self.context.session_id
        for _ in range(MAX_PARTIAL_RESUBMITS):
            remaining = sampling.max_tokens - len(out.token_ids)
            if out.finish_reason != "abort" or remaining <= 0:
                break
            self.context.metrics["partial_rollouts"] = (
                self.context.metrics.get("partial_rollouts", 0) + 1
            )
            more = await client.generate(
                session, prompt_ids + out.token_ids, replace(sampling, max_tokens=remaining)
            )
            out = join_outputs(out, more)
        return out

    async def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt ids for ``messages`` (with the tools), rendered off the event loop."""
        return await self.renderer.encode_prompt(messages)

    async def conversation(self, messages: list[dict[str, Any]]) -> Conversation:
        """A message-level ``Conversation`` starting from ``messages`` (the prompt), token-exact
        through ``TrajectoryBuilder`` and the chat template's deltas."""
        from agentrl.agent_loops.conversation import Conversation

        return Conversation(self, messages, await self.apply_chat_template(messages))

    def turn_sampling(self, sampling: SamplingParams, budget: int) -> SamplingParams:
        """``sampling`` with ``max_tokens`` capped by the remaining response budget."""
        if sampling.max_tokens <= budget:
            return sampling
        return replace(sampling, max_tokens=max(1, budget))

    @abstractmethod
    async def run(
        self, sample: dict[str, Any], sampling: SamplingParams
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run one episode of ``sample`` (a dataset row); return its training sample(s)."""
