"""Agent loops for tests: multi-turn without tools (and one scripted tool call), so a
random tiny model exercises them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.tool_calls import ToolCallExecutor, truncate_response
from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import SamplingParams
from agentrl.tools.parsers import ParsedTurn
from agentrl.tools.schema import FunctionCall

FOLLOW_UPS = ("Go on.", "And then?", "Finish.")


class MultiTurnChatLoop(AgentLoopBase):
    """Three model turns of at most a third of the budget each, separated by fixed user
    messages (mask 0).

    Use as ``rollout.agent_name=agentrl.testing.loops:MultiTurnChatLoop``.
    """

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        messages = [dict(m) for m in sample["prompt"]]
        trajectory = TrajectoryBuilder(await self.apply_chat_template(messages))
        budget = self.config.max_response_length
        per_turn = max(1, budget // 3)
        for follow_up in (*FOLLOW_UPS[:2], None):
            room = min(per_turn, budget - trajectory.response_length)
            out = await self.generate(trajectory.ids, self.turn_sampling(sampling, room))
            trajectory.add_model_turn(out)
            if follow_up is None or trajectory.response_length >= budget:
                break
            ended = self.renderer.ends_turn(out.token_ids)
            text = self.tokenizer.decode(out.token_ids[:-1] if ended else out.token_ids)
            new = [{"role": "user", "content": follow_up}]
            delta = await self.renderer.encode_delta(new, ended)
            trajectory.add_env_tokens(delta[: budget - trajectory.response_length])
            messages += [{"role": "assistant", "content": text}, *new]
            if trajectory.response_length >= budget:
                break
        return trajectory.build(max_response_length=budget)


class FixedLengthLoop(AgentLoopBase):
    """One turn of exactly ``extra_info["response_tokens"]`` tokens (long-tail benchmarks).

    Use as ``rollout.agent_name=agentrl.testing.loops:FixedLengthLoop``.
    """

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        length = int((sample.get("extra_info") or {}).get("response_tokens", sampling.max_tokens))
        trajectory = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
        turn = replace(sampling, max_tokens=length, ignore_eos=True)
        trajectory.add_model_turn(await self.generate(trajectory.ids, turn))
        return trajectory.build()


class CodeToolLoop(AgentLoopBase):
    """A model turn, then one real ``code_interpreter`` call running the row's
    ``extra_info["code"]`` (whatever the model said: a random model writes no calls), the
    tool's answer as environment tokens, and a last model turn. Fault tests hang or kill
    the sandbox process that runs the code during a training run.

    Records ``sandbox_ok``, ``sandbox_wall_limit`` (the code outlived the wall-clock
    limit) and ``sandbox_killed`` (the process died of a signal) in the output's metrics.
    Use as ``rollout.agent_name=agentrl.testing.loops:CodeToolLoop`` with a tool config
    that has ``code_interpreter``.
    """

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        config = self.config
        trajectory = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
        budget = config.max_response_length
        out = await self.generate(trajectory.ids, self.turn_sampling(sampling, budget // 2))
        trajectory.add_model_turn(out)
        ended = self.renderer.ends_turn(out.token_ids)
        code = sample["extra_info"]["code"]
        call = FunctionCall(name="code_interpreter", arguments={"code": code})
        executor = ToolCallExecutor(self.tools, 1, config.tool_timeout_s)
        try:
            (result,) = await executor.run_turn(ParsedTurn(content="", calls=[call]))
        finally:
            await executor.release()
        text = truncate_response(
            result.text, config.max_tool_response_length, config.tool_response_truncate_side
        )
        delta = await self.renderer.encode_delta([{"role": "tool", "content": text}], ended)
        trajectory.add_env_tokens(delta[: budget - trajectory.response_length])
        room = budget - trajectory.response_length
        if room > 0:
            out = await self.generate(trajectory.ids, self.turn_sampling(sampling, room))
            trajectory.add_model_turn(out)
        metrics = {
            "sandbox_ok": int(bool(result.metrics.get("ok"))),
            "sandbox_wall_limit": int("wall-clock limit" in result.text),
            "sandbox_killed": int("killed by" in result.text),
        }
        return trajectory.build(max_response_length=budget, metrics=metrics)
