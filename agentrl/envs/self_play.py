"""Self-play: the policy being trained plays the other seats of a multi-player environment.

An environment that defines ``bind_policy(policy)`` gets, from ``EnvAgentLoop``, a
``SelfPlayPolicy`` before its ``reset``. On another player's turn it calls
``policy.move(seat, messages)`` (async environments) or ``policy.move_blocking(seat,
messages)`` (plain-method environments, which the loop runs in a thread) with what that
seat sees since its last move, and gets the policy's answer as text.

Each seat is a ``Conversation`` of its own on the episode's replica, token-exact like the
model's player. With ``rollout.env.self_play_trained: both`` the loop returns every seat's
trajectory for training, each with the reward the environment reports for that seat.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentrl.envs.base import EnvError, Message

if TYPE_CHECKING:
    from agentrl.agent_loops.base import AgentLoopBase
    from agentrl.agent_loops.conversation import Conversation
    from agentrl.core.types import SamplingParams


class SelfPlayPolicy:
    """The policy, seat by seat, for one episode (``seats`` holds each seat's chat and the
    response positions where its turns end)."""

    def __init__(self, loop: AgentLoopBase, sampling: SamplingParams, timeout_s: float) -> None:
        self._loop = loop
        self._sampling = sampling
        self._timeout_s = timeout_s
        self._event_loop = asyncio.get_running_loop()
        self.seats: dict[Any, Conversation] = {}
        self.turn_ends: dict[Any, list[int]] = {}

    async def move(self, seat: Any, messages: list[Message]) -> str:
        """The policy's move for ``seat``, given ``messages``: the seat's opening messages
        on its first move, after that what reached it since its last one."""
        conv = self.seats.get(seat)
        if conv is None:
            conv = self.seats[seat] = await self._loop.conversation(messages)
            self.turn_ends[seat] = []
        elif messages:
            await conv.add_messages(messages)
        text = await conv.generate(self._sampling)
        self.turn_ends[seat].append(conv.trajectory.response_length)
        return text

    def move_blocking(self, seat: Any, messages: list[Message]) -> str:
        """``move`` for an environment running in a thread (waits at most the step's time
        limit); on the worker's event loop it cannot wait, and raises ``EnvError``."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._event_loop:
            raise EnvError(
                "self-play needs the environment off the event loop: set "
                "rollout.env.sync_in_thread: true"
            )
        future = asyncio.run_coroutine_threadsafe(self.move(seat, messages), self._event_loop)
        try:
            return future.result(timeout=self._timeout_s)
        except TimeoutError:
            future.cancel()
            raise EnvError(
                f"the policy's move for seat {seat} took over {self._timeout_s:g} s"
            ) from None
