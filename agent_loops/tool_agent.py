"""``tool_agent``: multi-turn tool calling, token-exact.

generate → parse tool calls → execute them → append the template delta of the tool
responses → generate again, until the model stops calling tools or a limit is reached
(``max_assistant_turns``, ``max_user_turns``, the response token budget).
"""

from __future__ import annotations

import random
import time
from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.agent_loops.tool_calls import ToolCallExecutor, truncate_response
from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import SamplingParams


@register_agent_loop("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """The built-in multi-turn tool-calling loop (Hermes-style calls by default)."""

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> AgentLoopOutput:
        config = self.config
        check_drift = random.random() < config.drift_check_rate
        # The conversation as messages is only built when something reads it.
        messages = (
            [dict(m) for m in sample["prompt"]] if check_drift or config.keep_messages else None
        )
        trajectory = TrajectoryBuilder(await self.apply_chat_template(sample["prompt"]))
        executor = ToolCallExecutor(self.tools, config.max_parallel_calls, config.tool_timeout_s)
        metrics: dict[str, float] = {}
        try:
            stop_reason = await self._loop(messages, trajectory, executor, sampling, metrics)
            tool_reward = await executor.rewards()
        finally:
            await executor.release()
        extra: dict[str, Any] = {"stop_reason": stop_reason, "tool_reward": tool_reward}
        if check_drift:
            report = await self.renderer.check_drift(messages, trajectory.ids)
            metrics["drift_checked"] = 1
            metrics["tokenization_drift"] = int(report.drifted)
        if config.keep_messages:
            extra["messages"] = messages
        return trajectory.build(
            max_response_length=config.max_response_length, metrics=metrics, extra=extra
        )

    async def _loop(
        self,
        messages: list[dict[str, Any]] | None,
        trajectory: TrajectoryBuilder,
        executor: ToolCallExecutor,
        sampling: SamplingParams,
        metrics: dict[str, float],
    ) -> str:
        """Run turns until a stop condition; returns the stop reason. ``messages`` (when
        kept) gets every new message; ``metrics`` the turn, time and tool-call counts."""
        # Read once: this loop runs thousands of times a second per worker.
        config, renderer, parser = self.config, self.renderer, self.context.tool_parser
        reasoning_parser = self.context.reasoning_parser
        decode, ends_turn = renderer.decode_text, renderer.ends_turn
        perf_counter = time.perf_counter
        budget = config.max_response_length
        limit, side = config.max_tool_response_length, config.tool_response_truncate_side
        response = trajectory.response_ids  # grows in place as turns are added
        gen_time = tool_time = 0.0
        assistant_turns = user_turns = 0
        call_counts: dict[tuple[str, str], int] = {}
        try:
            while True:
                start = perf_counter()
                room = budget - len(response)
                out = await self.generate(trajectory.ids, self.turn_sampling(sampling, room))
                gen_time += perf_counter() - start
                trajectory.add_model_turn(out)
                assistant_turns += 1
                token_ids = out.token_ids
                ended_with_eos = ends_turn(token_ids)
                text = decode(token_ids[:-1] if ended_with_eos else token_ids)
                reasoning = None
                if reasoning_parser is not None:
                    reasoning, text = reasoning_parser.split(text)
                if messages is not None:
                    messages.append(parser.turn_message(text, reasoning))

                if out.finish_reason == "abort":
                    return "aborted"
                if len(response) >= budget:
                    return "response_budget"
                parsed = parser.parse(text)
                if parsed.attempted_calls == 0:
                    return "no_tool_call"
                if assistant_turns >= config.max_assistant_turns:
                    return "max_assistant_turns"
                if user_turns >= config.max_user_turns:
                    return "max_user_turns"

                start = perf_counter()
                results = await executor.run_turn(parsed)
                tool_time += perf_counter() - start
                tool_messages = []
                for result in results:
                    key = (result.tool, result.outcome)
                    call_counts[key] = call_counts.get(key, 0) + 1
                    content = truncate_response(result.text, limit, side)
                    # The function's name: formats whose results name their function
                    # (Harmony's functions.NAME) read it; the others ignore it. The id,
                    # when the model wrote one, names the call (Kimi K2's results do).
                    message = {"role": "tool", "name": result.tool, "content": content}
                    if result.call_id is not None:
                        message["tool_call_id"] = result.call_id
                    tool_messages.append(message)
                delta = await renderer.encode_delta(tool_messages, ended_with_eos)
                room = budget - len(response)
                trajectory.add_env_tokens(delta if len(delta) <= room else delta[:room])
                if messages is not None:
                    messages.extend(tool_messages)
                user_turns += 1
                if len(delta) >= room:
                    return "response_budget"
        finally:
            metrics["gen_time_s"] = gen_time
            metrics["assistant_turns"] = assistant_turns
            if user_turns:
                metrics["user_turns"] = user_turns
                metrics["tool_time_s"] = tool_time
            if call_counts:
                metrics.update(_call_metrics(call_counts))


def _call_metrics(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    """``tool_calls``, ``tool_calls/<outcome>`` and ``tool_calls/<tool>/<outcome>``."""
    metrics: dict[str, int] = {"tool_calls": sum(counts.values())}
    for (tool, outcome), count in counts.items():
        by_outcome = f"tool_calls/{outcome}"
        metrics[by_outcome] = metrics.get(by_outcome, 0) + count
        metrics[f"tool_calls/{tool}/{outcome}"] = count
    return metrics
