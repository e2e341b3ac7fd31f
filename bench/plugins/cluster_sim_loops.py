"""The agentic loop of ``bench/cluster_sim.py``: model turns with tool calls in between.

Loaded as a plugin (``plugins: [bench/plugins/cluster_sim_loops.py]``), so the driver and
every agent-loop worker register it. A row's ``extra_info`` fixes the episode's work, so
every mode of the bench generates exactly the same tokens:

- ``turn_tokens``: the length of each model turn (``ignore_eos``: the engine, real or
  simulated, produces exactly that many tokens);
- ``tool_latency_s``: after every turn but the last, the modeled seconds its tool call
  takes; the loop sleeps them times ``time_scale``, as the simulated GPUs do;
- ``tool_tokens``: the size of each tool answer, added as environment tokens (mask 0).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams

LOOP_NAME = "cluster_sim_tool_agent"


@register_agent_loop(LOOP_NAME)
class SleepToolAgentLoop(AgentLoopBase):
    """Turns of fixed lengths, each but the last followed by a tool call that sleeps."""

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        info = sample["extra_info"]
        turns, latencies = info["turn_tokens"], info["tool_latency_s"]
        answer = [{"role": "tool", "content": " ".join(["result"] * int(info["tool_tokens"]))}]
        conv = await self.conversation(sample["prompt"])
        for turn, tokens in enumerate(turns):
            await conv.generate(sampling, max_tokens=int(tokens), ignore_eos=True)
            if turn == len(turns) - 1 or conv.remaining_tokens == 0:
                break
            await asyncio.sleep(latencies[turn] * info["time_scale"])
            await conv.add_messages(answer)
            if conv.remaining_tokens == 0:
                break
        return conv.build()
