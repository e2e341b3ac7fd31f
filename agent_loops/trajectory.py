"""``TrajectoryBuilder``: accumulates a multi-turn conversation token by token."""

from __future__ import annotations

from typing import Any

from agentrl.agent_loops.output import ENV_TOKEN_VERSION, AgentLoopOutput, TrajectoryError
from agentrl.server.types import TokenOutput


class TrajectoryBuilder:
    """Appends model turns (exact engine output) and environment turns (mask 0).

    The conversation so far (``prompt_ids + response_ids``) is what the next turn sends to
    the engine: nothing is ever decoded and re-encoded.

    Only the token ids grow turn by turn; each model turn is kept as a segment (where it
    starts and ends, the engine's logprobs and versions), and the per-token mask, logprob
    and version lists are laid out and checked once, by ``build`` (or when read before).
    The builder keeps ``prompt_ids`` as given, without a copy, and never changes it.
    """

    def __init__(self, prompt_ids: list[int]) -> None:
        # Not copied (the renderer hands out a new list per call); never mutated here.
        self.prompt_ids = prompt_ids
        self.response_ids: list[int] = []
        self.num_turns = 0
        # (start, end, logprobs, versions) of each model turn in the response.
        self._model_turns: list[tuple[int, int, list[float], list[int]]] = []

    @property
    def ids(self) -> list[int]:
        """Prompt plus everything appended so far (a new list)."""
        return self.prompt_ids + self.response_ids

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def add_model_turn(self, out: TokenOutput) -> None:
        """Append the engine's tokens with their logprobs and versions (mask 1).

        The turn's logprobs and versions are checked when the per-token lists are laid
        out (``build``): a turn whose lengths disagree or with a token without a policy
        version raises ``TrajectoryError`` there.
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

    @property
    def response_mask(self) -> list[int]:
        """1 on model tokens, 0 on tool/user tokens."""
        return self._per_token()[0]

    @property
    def response_logprobs(self) -> list[float]:
        """The engine's logprob on model tokens, 0.0 elsewhere."""
        return self._per_token()[1]

    @property
    def response_versions(self) -> list[int]:
        """The sampling policy's version on model tokens, ``ENV_TOKEN_VERSION`` elsewhere."""
        return self._per_token()[2]

    def _per_token(self) -> tuple[list[int], list[float], list[int]]:
        n = len(self.response_ids)
        mask, logprobs, versions = [0] * n, [0.0] * n, [ENV_TOKEN_VERSION] * n
        for start, end, turn_logprobs, turn_versions in self._model_turns:
            mask[start:end] = [1] * (end - start)
            # A turn whose logprobs or versions are too short or long changes the length
            # of the whole list: one check at the end finds it.
            logprobs[start:end] = turn_logprobs
            versions[start:end] = turn_versions
            if turn_versions and min(turn_versions) < 0:
                self._raise_bad_turn()
        if len(logprobs) != n or len(versions) != n:
            self._raise_bad_turn()
        return mask, logprobs, versions

    def _raise_bad_turn(self) -> None:
        for start, end, turn_logprobs, turn_versions in self._model_turns:
            if len(turn_logprobs) != end - start or len(turn_versions) != end - start:
                raise TrajectoryError(
                    f"engine turn at response token {start} has {end - start} tokens, "
                    f"{len(turn_logprobs)} logprobs and {len(turn_versions)} versions"
                )
            if turn_versions and min(turn_versions) < 0:
                raise TrajectoryError(
                    f"engine turn at response token {start} has a token without a policy "
                    f"version: {turn_versions}"
                )

    def build(
        self,
        *,
        max_response_length: int | None = None,
        metrics: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> AgentLoopOutput:
        """The sample, cut to ``max_response_length`` tokens if given.

        The output takes over the builder's id lists and the ``metrics`` and ``extra``
        dicts given: build once, when the episode is done.
        """
        mask, logprobs, versions = self._per_token()
        if max_response_length is not None and len(self.response_ids) > max_response_length:
            for values in (self.response_ids, mask, logprobs, versions):
                del values[max_response_length:]
        return AgentLoopOutput(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            response_versions=versions,
            num_turns=self.num_turns,
            metrics={} if metrics is None else metrics,
            extra={} if extra is None else extra,
            # Every append above keeps the per-token rules; only lengths are re-checked.
            check_tokens=False,
        )
