"""``Conversation``: a multi-turn loop written at the message level, kept token-exact.

``await self.conversation(messages)`` (on ``AgentLoopBase``) renders the prompt with the
loop's chat template and returns a ``Conversation`` over a ``TrajectoryBuilder``:

- ``await conv.generate(sampling)`` runs a model turn on the episode's replica and keeps
  its exact tokens (mask 1, with their logprobs and policy versions);
- ``await conv.add_messages([...])`` appends the chat template's delta for new user or
  tool messages (mask 0): only the new messages are tokenized, nothing is re-encoded;
- ``conv.build()`` returns the ``AgentLoopOutput``, cut to ``rollout.max_response_length``.

The ids are those a loop gets by hand from ``TrajectoryBuilder`` and
``renderer.encode_delta``; ``conv.messages`` holds the same conversation as chat messages.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.tools.parsers import ParsedTurn
from agentrl.tools.schema import FunctionCall

if TYPE_CHECKING:
    from agentrl.agent_loops.base import AgentLoopBase


class ConversationError(RuntimeError):
    """A ``Conversation`` step out of order (messages before any model turn, two model
    turns in a row, messages added twice in a row)."""


class Conversation:
    """One episode's chat: model turns and added messages, alternating, token-exact.

    ``messages``: the chat so far (the prompt, each model turn as an assistant message,
    every added message). ``trajectory``: the ``TrajectoryBuilder`` holding the ids.
    After each ``generate``: ``last_output`` (the engine's ``TokenOutput``),
    ``last_parsed`` (the turn parsed by the loop's tool-call parser) and
    ``last_tool_calls`` (its valid calls).
    """

    def __init__(
        self, loop: AgentLoopBase, messages: list[dict[str, Any]], prompt_ids: list[int]
    ) -> None:
        self._loop = loop
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.trajectory = TrajectoryBuilder(prompt_ids)
        self.last_output: TokenOutput | None = None
        self.last_parsed: ParsedTurn | None = None
        # Whether the next step is a model turn (True) or added messages (False), and
        # whether the last model turn ended with a stop token (encode_delta's argument).
        self._model_next = True
        self._ended_with_stop = True

    @property
    def turns(self) -> int:
        """Turns so far, model and environment (the output's ``num_turns``)."""
        return self.trajectory.num_turns

    @property
    def remaining_tokens(self) -> int:
        """Tokens left of the episode's response budget (``rollout.max_response_length``)."""
        return max(0, self._loop.config.max_response_length - self.trajectory.response_length)

    @property
    def finish_reason(self) -> str | None:
        """How the last model turn ended (``stop``, ``length``, ``abort``); ``length`` once
        the response budget is spent; None before the first turn."""
        if self.last_output is None:
            return "length" if self.remaining_tokens == 0 else None
        return self.last_output.finish_reason

    @property
    def last_tool_calls(self) -> list[FunctionCall]:
        """The valid tool calls of the last model turn (empty if it made none)."""
        return [] if self.last_parsed is None else self.last_parsed.calls

    async def generate(self, sampling: SamplingParams, **overrides: Any) -> str:
        """Run one model turn and return its text (after any reasoning, tool-call blocks
        included, without the stop token).

        ``overrides`` replace fields of ``sampling`` for this turn (``max_tokens=32``);
        ``max_tokens`` is capped by ``remaining_tokens``. The turn is sent with the
        episode's session id (a turn aborted by a weight swap is resumed, see
        ``AgentLoopBase.generate``), its tokens are kept with mask 1, and the turn is
        appended to ``messages`` as an assistant message. With the budget spent, no
        model call is made and ``""`` is returned.
        """
        room = self.remaining_tokens
        if room == 0:
            self.last_output, self.last_parsed = None, None
            return ""
        if not self._model_next:
            raise ConversationError(
                "generate follows a model turn: add the environment's reply with add_messages first"
            )
        loop = self._loop
        if overrides:
            sampling = replace(sampling, **overrides)
        out = await loop.generate(self.trajectory.ids, loop.turn_sampling(sampling, room))
        self.trajectory.add_model_turn(out)
        renderer, context = loop.renderer, loop.context
        ended = renderer.ends_turn(out.token_ids)
        text = renderer.decode_text(out.token_ids[:-1] if ended else out.token_ids)
        reasoning = None
        if context.reasoning_parser is not None:
            reasoning, text = context.reasoning_parser.split(text)
        self.messages.append(context.tool_parser.turn_message(text, reasoning))
        self.last_output, self.last_parsed = out, context.tool_parser.parse(text)
        self._model_next, self._ended_with_stop = False, ended
        return text

    async def add_messages(self, messages: list[dict[str, Any]]) -> None:
        """Append user or tool ``messages`` after the last model turn, as the chat
        template's delta (mask 0), which ends with the next assistant header.

        All messages answering one model turn go in one call.
        """
        if not messages:
            raise ValueError("add_messages needs at least one message")
        if self._model_next:
            raise ConversationError(
                "add_messages follows a model turn: call generate first (the prompt and "
                "the messages added last are already rendered; give all of a turn's "
                "messages in one call)"
            )
        delta = await self._loop.renderer.encode_delta(messages, self._ended_with_stop)
        self.trajectory.add_env_tokens(delta)
        self.messages.extend(dict(m) for m in messages)
        self._model_next = True

    def build(
        self, *, metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None
    ) -> AgentLoopOutput:
        """The episode's sample, cut to ``rollout.max_response_length`` tokens; with
        ``rollout.keep_messages``, ``extra["messages"]`` holds ``messages``. Build once,
        when the episode is done (the output takes over the builder's lists)."""
        config = self._loop.config
        if config.keep_messages:
            extra = {**(extra or {}), "messages": self.messages}
        return self.trajectory.build(
            max_response_length=config.max_response_length, metrics=metrics, extra=extra
        )
