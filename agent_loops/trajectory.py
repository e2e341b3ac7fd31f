"""``TrajectoryBuilder``: accumulates a multi-turn conversation token by token."""

from __future__ import annotations

from typing import Any

from agentrl.agent_loops.output import AgentLoopOutput, ModelSpan, truncate_spans
from agentrl.server.types import TokenOutput


class TrajectoryBuilder:
    """Appends model turns (exact engine output) and environment turns (mask 0).

    The conversation so far (``prompt_ids + response_ids``) is what the next turn sends to
    the engine: nothing is ever decoded and re-encoded.

    Only the token ids grow turn by turn; each model turn is kept as a span (where it
    starts and ends, the engine's logprobs and versions), which is also how the output
    stores it (``AgentLoopOutput.model_spans``): nothing is laid out per token here.
    The builder keeps ``prompt_ids`` as given, without a copy, and never changes it.
    """

    def __init__(self, prompt_ids: list[int]) -> None:
        # Not copied (the renderer hands out a new list per call); never mutated here.
        self.prompt_ids = prompt_ids
        self.response_ids: list[int] = []
        self.num_turns = 0
        self._model_turns: list[ModelSpan] = []

    @property
    def ids(self) -> list[int]:
        """Prompt plus everything appended so far (a new list)."""
        return self.prompt_ids + self.response_ids

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def add_model_turn(self, out: TokenOutput) -> None:
        """Append the engine's tokens with their logprobs and versions (mask 1).

        The turn's logprobs and versions are checked by ``build``.
        """
        response_ids = self.response_ids
        start = len(response_ids)
        response_ids += out.token_ids
        # Only what build needs: the engine's output object and token list may go.
        self._model_turns.append((start, len(response_ids), out.logprobs, out.token_versions))
        self.num_turns += 1

    def add_env_tokens(self, token_ids: list[int], *, new_turn: bool = True) -> None:
        """Append tool/user tokens (mask 0, logprob 0.0)."""
        self.response_ids += token_ids
        if new_turn:
            self.num_turns += 1

    def build(
        self,
        *,
        max_response_length: int | None = None,
        metrics: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> AgentLoopOutput:
        """The sample, cut to ``max_response_length`` tokens if given.

        The output takes over the builder's lists and the ``metrics`` and ``extra`` dicts
        given: build once, when the episode is done. A model turn whose logprob or version
        count disagrees with its tokens, or with a token without a policy version, raises
        ``TrajectoryError`` naming the turn.
        """
        spans = self._model_turns
        if max_response_length is not None and len(self.response_ids) > max_response_length:
            del self.response_ids[max_response_length:]
            spans = truncate_spans(spans, max_response_length)
        return AgentLoopOutput(
            self.prompt_ids,
            self.response_ids,
            model_spans=spans,
            num_turns=self.num_turns,
            metrics=metrics,
            extra=extra,
        )
