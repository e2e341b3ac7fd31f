"""``TrajectoryBuilder``: accumulates a multi-turn conversation token by token."""

from __future__ import annotations

from typing import Any

from agentrl.agent_loops.output import AgentLoopOutput, ModelSpan, TrajectoryError, truncate_spans
from agentrl.server.types import TokenOutput


class TrajectoryBuilder:
    """Appends model turns (exact engine output) and environment turns (mask 0).

    The conversation so far (``prompt_ids + response_ids``) is what the next turn sends to
    the engine: nothing is ever decoded and re-encoded.

    Only the token ids and the model tokens' logprobs and versions grow turn by turn, with
    one ``(start, end)`` span per model turn: the output's compact form
    (``AgentLoopOutput.model_spans``, ``model_logprobs``, ``model_versions``); nothing is
    laid out per token here.
    The builder keeps ``prompt_ids`` as given, without a copy, and never changes it.
    """

    def __init__(self, prompt_ids: list[int]) -> None:
        # Not copied (the renderer hands out a new list per call); never mutated here.
        self.prompt_ids = prompt_ids
        self.response_ids: list[int] = []
        self.num_turns = 0
        self._model_spans: list[ModelSpan] = []
        self._model_logprobs: list[float] = []
        self._model_versions: list[int] = []

    @property
    def ids(self) -> list[int]:
        """Prompt plus everything appended so far (a new list)."""
        return self.prompt_ids + self.response_ids

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def add_model_turn(self, out: TokenOutput) -> None:
        """Append the engine's tokens with their logprobs and versions (mask 1).

        Raises ``TrajectoryError`` when the engine's logprob or version count disagrees
        with its token count; ``build`` checks that every model token has a version.
        """
        response_ids, token_ids = self.response_ids, out.token_ids
        start = len(response_ids)
        if len(out.logprobs) != len(token_ids) or len(out.token_versions) != len(token_ids):
            raise TrajectoryError(
                f"engine turn at response token {start} has {len(token_ids)} tokens, "
                f"{len(out.logprobs)} logprobs and {len(out.token_versions)} versions"
            )
        response_ids += token_ids
        self._model_spans.append((start, len(response_ids)))
        self._model_logprobs += out.logprobs
        self._model_versions += out.token_versions
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
        given: build once, when the episode is done. A model token without a policy version
        raises ``TrajectoryError``.
        """
        spans, logprobs, versions = self._model_spans, self._model_logprobs, self._model_versions
        if max_response_length is not None and len(self.response_ids) > max_response_length:
            del self.response_ids[max_response_length:]
            spans, kept = truncate_spans(spans, max_response_length)
            del logprobs[kept:], versions[kept:]
        return AgentLoopOutput(
            self.prompt_ids,
            self.response_ids,
            model_spans=spans,
            model_logprobs=logprobs,
            model_versions=versions,
            num_turns=self.num_turns,
            metrics=metrics,
            extra=extra,
        )
