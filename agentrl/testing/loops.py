"""Agent loops for tests: multi-turn without tools, so a random tiny model exercises them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import SamplingParams

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
            ended = bool(out.token_ids) and out.token_ids[-1] == self.tokenizer.eos_token_id
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
