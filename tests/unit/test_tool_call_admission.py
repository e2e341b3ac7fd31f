"""The per-call time limit starts when the tool admits the call, not while it queues."""

from __future__ import annotations

import asyncio
import contextlib

from agentrl.agent_loops.tool_calls import CallOutcome, ToolCallExecutor
from agentrl.tools import BaseTool, FunctionCall, ToolResponse
from agentrl.tools.parsers import ParsedTurn

SCHEMA = {
    "type": "function",
    "function": {"name": "pooled", "parameters": {"type": "object", "properties": {}}},
}


class PooledTool(BaseTool):
    """Takes 0.2 s per call and runs one call at a time across all episodes."""

    def __init__(self, admit: bool) -> None:
        super().__init__(tool_schema=SCHEMA)
        self.pool = asyncio.Semaphore(1)
        self.admit = admit

    def admission(self) -> contextlib.AbstractAsyncContextManager:
        return self.pool if self.admit else contextlib.nullcontext()

    async def execute(self, instance_id, parameters, **kwargs):
        if self.admit:
            if not self.pool.locked():
                raise RuntimeError("called without being admitted")
            await asyncio.sleep(0.2)
        else:
            async with self.pool:  # queueing inside execute counts against the limit
                await asyncio.sleep(0.2)
        return ToolResponse(text="done"), 0.0, {}


async def _outcomes(tool: PooledTool, episodes: int) -> list[CallOutcome]:
    turn = ParsedTurn(content="", calls=[FunctionCall(name="pooled", arguments={})])

    async def episode() -> CallOutcome:
        executor = ToolCallExecutor({"pooled": tool}, max_parallel=1, timeout_s=0.5)
        (result,) = await executor.run_turn(turn)
        return result.outcome

    return list(await asyncio.gather(*(episode() for _ in range(episodes))))


async def test_calls_queued_for_admission_do_not_time_out():
    # Four calls of 0.2 s through a pool of one: the last waits 0.6 s, beyond the limit.
    assert await _outcomes(PooledTool(admit=True), 4) == [CallOutcome.OK] * 4


async def test_waiting_inside_execute_still_counts_against_the_limit():
    outcomes = await _outcomes(PooledTool(admit=False), 4)
    assert CallOutcome.TIMEOUT in outcomes
    assert outcomes.count(CallOutcome.OK) >= 2
