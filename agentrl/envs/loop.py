"""``EnvAgentLoop`` (``agent_name: env``): runs a text environment with the model.

reset → model turn → step → the environment's messages → model turn → ... until the
environment says the episode is over, ``rollout.env.max_turns`` model turns were made,
or the response budget (``rollout.max_response_length``) is spent. Model turns keep the
engine's exact tokens (mask 1); the environment's messages come in as the chat
template's delta (mask 0), so the ids are those of the conversation rendered once.

Every step's reward is kept: ``extra["turn_rewards"]``, with ``extra["turn_ends"]`` the
response position where the model turn that earned it ends. The episode's reward
(``output.reward``, ``metrics["env/reward"]``) is their ``rollout.env.reward_aggregate``;
the reward function ``agentrl.envs.reward`` hands it to training.
"""

from __future__ import annotations

import random
import time
from typing import Any

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.conversation import Conversation
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams
from agentrl.envs.base import EnvError, Message
from agentrl.envs.registry import env_factory
from agentrl.envs.reward import ENV_REWARD_METRIC
from agentrl.envs.runner import EnvRunner
from agentrl.envs.self_play import SelfPlayPolicy

STOP_REASONS = ("terminated", "truncated", "max_turns", "response_budget", "aborted")
"""``extra["stop_reason"]`` values: the environment ended the episode (``terminated``,
``truncated``), or the loop did (``max_turns``, the ``response_budget``, a turn the engine
``aborted``)."""


def aggregate_rewards(rewards: list[float], how: str) -> float:
    """The episode reward of per-turn ``rewards``: ``sum``, ``last`` or ``mean`` (0.0 for
    an episode with no step)."""
    if not rewards:
        return 0.0
    if how == "sum":
        return float(sum(rewards))
    if how == "last":
        return rewards[-1]
    if how == "mean":
        return float(sum(rewards)) / len(rewards)
    raise ValueError(f"unknown reward aggregate {how!r}; one of sum, last, mean")


@register_agent_loop("env")
class EnvAgentLoop(AgentLoopBase):
    """Runs the environment of ``rollout.env`` (or of the row's ``extra_info.env_source``).

    A row may carry ``extra_info.env_seed`` (passed to ``reset``) and
    ``extra_info.env_kwargs`` (merged over ``rollout.env.kwargs``). An environment that
    raises, hangs past ``rollout.env.step_timeout_s`` or returns a malformed step fails
    the episode with an ``EnvError`` naming the step; the worker records it.

    An environment with ``bind_policy`` gets the policy for its other seats
    (:mod:`agentrl.envs.self_play`); with ``rollout.env.self_play_trained: both`` the
    episode returns the model's player's trajectory first, then each other seat's.
    """

    async def run(
        self, sample: dict[str, Any], sampling: SamplingParams
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        cfg = self.config.env
        extra_info = sample.get("extra_info") or {}
        source = extra_info.get("env_source") or cfg.source
        if not source:
            raise EnvError(
                "no environment: set rollout.env.source (or the row's extra_info.env_source)"
            )
        kwargs = {**cfg.kwargs, **(extra_info.get("env_kwargs") or {})}
        try:
            env = env_factory(source)(**kwargs)
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"env {source} could not be made: {type(exc).__name__}: {exc}") from exc
        runner = EnvRunner(env, source, cfg.step_timeout_s, cfg.sync_in_thread)
        self_play = None
        if callable(getattr(env, "bind_policy", None)):
            self_play = SelfPlayPolicy(self, sampling, cfg.step_timeout_s)
            env.bind_policy(self_play)
        try:
            output, info = await self._episode(runner, sample, extra_info.get("env_seed"), sampling)
        finally:
            await runner.close()
        if self_play is None or cfg.self_play_trained == "player" or not self_play.seats:
            return output
        return [output, *self._seat_outputs(self_play, info)]

    def _seat_outputs(
        self, self_play: SelfPlayPolicy, info: dict[str, Any]
    ) -> list[AgentLoopOutput]:
        """The trajectories of the seats the policy played for the environment, each
        earning, on its last turn, the reward ``info["player_rewards"]`` gives its seat."""
        rewards = info.get("player_rewards") or {}
        outputs = []
        for seat, conv in self_play.seats.items():
            ends = self_play.turn_ends[seat]
            reward = float(rewards.get(seat, 0.0))
            turn_rewards = [0.0] * len(ends)
            if turn_rewards:
                turn_rewards[-1] = reward
            output = conv.build(
                metrics={ENV_REWARD_METRIC: reward, "env/seat": seat},
                extra={"turn_rewards": turn_rewards, "turn_ends": ends, "self_play_seat": seat},
            )
            output.reward = reward
            outputs.append(output)
        return outputs

    async def _episode(
        self,
        runner: EnvRunner,
        sample: dict[str, Any],
        seed: int | None,
        sampling: SamplingParams,
    ) -> tuple[AgentLoopOutput, dict[str, Any]]:
        """The model's player's trajectory, and the info of the environment's last step."""
        cfg = self.config.env
        messages, _ = await runner.reset(sample, seed)
        conv = await self.conversation(messages)
        rewards: list[float] = []
        turn_ends: list[int] = []
        final: list[Message] = []
        gen_time = 0.0
        stop = "max_turns"
        info: dict[str, Any] = {}
        for turn in range(1, cfg.max_turns + 1):
            start = time.perf_counter()
            await conv.generate(sampling)
            gen_time += time.perf_counter() - start
            if conv.last_output is None:  # no budget left for a model turn
                stop = "response_budget"
                break
            if conv.finish_reason == "abort":
                stop = "aborted"
                break
            result = await runner.step(_action_message(conv))
            info = result.info
            rewards.append(result.reward)
            turn_ends.append(conv.trajectory.response_length)
            if result.done:
                stop, final = ("terminated" if result.terminated else "truncated"), result.messages
                break
            if turn == cfg.max_turns:
                final = result.messages
                break
            if conv.remaining_tokens == 0:
                stop, final = "response_budget", result.messages
                break
            await conv.add_messages(result.messages)
            if conv.remaining_tokens == 0:
                stop = "response_budget"
                break
        output = await self._output(conv, runner, rewards, turn_ends, final, stop, gen_time)
        return output, info

    async def _output(
        self,
        conv: Conversation,
        runner: EnvRunner,
        rewards: list[float],
        turn_ends: list[int],
        final: list[Message],
        stop: str,
        gen_time: float,
    ) -> AgentLoopOutput:
        config = self.config
        reward = aggregate_rewards(rewards, config.env.reward_aggregate)
        metrics: dict[str, Any] = {
            ENV_REWARD_METRIC: reward,
            "env/steps": runner.steps,
            "env/step_time_s": runner.step_time_s,
            "env/terminated": int(stop == "terminated"),
            "gen_time_s": gen_time,
        }
        if random.random() < config.drift_check_rate:
            report = await self.renderer.check_drift(conv.messages, conv.trajectory.ids)
            metrics["drift_checked"] = 1
            metrics["tokenization_drift"] = int(report.drifted)
        # The last answer is never shown to the model; kept with the messages only.
        conv.messages.extend(final)
        output = conv.build(
            metrics=metrics,
            extra={"turn_rewards": rewards, "turn_ends": turn_ends, "stop_reason": stop},
        )
        output.reward = reward
        return output


def _action_message(conv: Conversation) -> Message:
    """The model's last turn as ``step`` gets it: the assistant message with its parsed
    tool calls (``tool_calls``, OpenAI-style with ``arguments`` as a dict) and the errors
    of calls it wrote malformed (``tool_call_errors``, when there are any)."""
    message = dict(conv.messages[-1])
    message["tool_calls"] = [
        {
            "id": call.id or f"call_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(conv.last_tool_calls)
    ]
    parsed = conv.last_parsed
    if parsed is not None and parsed.errors:
        message["tool_call_errors"] = list(parsed.errors)
    return message
