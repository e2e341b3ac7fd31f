"""``TrajectoryBuilder``: accumulates a multi-turn conversation token by token."""

from __future__ import annotations

from typing import Any

from agentrl.agent_loops.output import ENV_TOKEN_VERSION, AgentLoopOutput, TrajectoryError
from agentrl.server.types import TokenOutput


class TrajectoryBuilder:
    """Appends model turns (exact engine output) and environment turns (mask 0).

    The conversation so far (``prompt_ids + response_ids``) is what the next turn sends to
    the engine: nothing is ever decoded and re-encoded.
    """

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = list(prompt_ids)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.response_versions: list[int] = []
        self.num_turns = 0

    @property
    def ids(self) -> list[int]:
        """Prompt plus everything appended so far."""
        return self.prompt_ids + self.response_ids

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def add_model_turn(self, out: TokenOutput) -> None:
        """Append the engine's tokens with their logprobs and versions (mask 1)."""
        n = len(out.token_ids)
        if len(out.logprobs) != n or len(out.token_versions) != n:
            raise TrajectoryError(
                f"engine turn has {n} tokens, {len(out.logprobs)} logprobs and "
                f"{len(out.token_versions)} versions"
            )
        if n and min(out.token_versions) < 0:
            raise TrajectoryError(f"engine turn has a token without a policy version: {out}")
        self.response_ids += out.token_ids
        self.response_mask += [1] * n
        self.response_logprobs += out.logprobs
        self.response_versions += out.token_versions
        self.num_turns += 1

    def add_env_tokens(self, token_ids: list[int], *, new_turn: bool = True) -> None:
        """Append tool/user tokens (mask 0, logprob 0.0)."""
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)
        self.response_versions += [ENV_TOKEN_VERSION] * len(token_ids)
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

        The output takes over the builder's lists: build once, when the episode is done.
        """
        if max_response_length is not None and len(self.response_ids) > max_response_length:
            del self.response_ids[max_response_length:]
            del self.response_mask[max_response_length:]
            del self.response_logprobs[max_response_length:]
            del self.response_versions[max_response_length:]
        return AgentLoopOutput(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=self.response_mask,
            response_logprobs=self.response_logprobs,
            response_versions=self.response_versions,
            num_turns=self.num_turns,
            metrics=dict(metrics or {}),
            extra=dict(extra or {}),
            # Every append above keeps the per-token rules; only lengths are re-checked.
            check_tokens=False,
        )
