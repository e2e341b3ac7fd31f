"""``single_turn``: one model turn on the prompt, no tools."""

from __future__ import annotations

from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import SamplingParams


@register_agent_loop("single_turn")
class SingleTurnAgentLoop(AgentLoopBase):
    """Render the prompt, generate once within the response budget."""

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        prompt_ids = await self.apply_chat_template(sample["prompt"])
        trajectory = TrajectoryBuilder(prompt_ids)
        out = await self.generate(
            prompt_ids, self.turn_sampling(sampling, self.config.max_response_length)
        )
        trajectory.add_model_turn(out)
        return trajectory.build(extra={"finish_reason": out.finish_reason})
