"""The trajectory type every producer builds: ``AgentLoopOutput`` and ``TrajectoryBuilder``.

One training sample, token-exact: the agent loops build it turn by turn with
``TrajectoryBuilder``, the gateway builds it the same way from a session's recorded
calls, and the trainer reads it. Only the standard library.
"""

from __future__ import annotations

import operator
from dataclasses import InitVar, dataclass, field
from itertools import compress
from typing import Any

from agentrl.core.types import TokenOutput

ENV_TOKEN_VERSION = -1
"""``response_versions`` value of tokens the model did not generate (tool/user tokens)."""


class TrajectoryError(ValueError):
    """An ``AgentLoopOutput`` whose per-token fields disagree."""


@dataclass
class AgentLoopOutput:
    """Token-exact record of one sample.

    ``response_*`` lists are aligned token by token: ``response_mask[i]`` is 1 where the
    model produced ``response_ids[i]`` (with ``response_logprobs[i]`` and the policy
    ``response_versions[i]`` that sampled it) and 0 for tool/user tokens appended by the
    loop (logprob 0.0, version ``ENV_TOKEN_VERSION``).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    response_versions: list[int]
    num_turns: int = 0
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    check_tokens: InitVar[bool] = True
    """False skips the per-token rules (not the length checks) for producers whose
    construction guarantees them, such as ``TrajectoryBuilder``."""

    def __post_init__(self, check_tokens: bool) -> None:
        self.validate(check_tokens)

    def validate(self, check_tokens: bool = True) -> None:
        """Raise ``TrajectoryError`` unless all per-token lists are consistent."""
        n = len(self.response_ids)
        lengths = (
            len(self.response_mask),
            len(self.response_logprobs),
            len(self.response_versions),
        )
        if lengths != (n, n, n):
            names = ("response_mask", "response_logprobs", "response_versions")
            wrong = {
                name: length for name, length in zip(names, lengths, strict=True) if length != n
            }
            raise TrajectoryError(f"response_ids has {n} tokens but {wrong}")
        if not self.prompt_ids:
            raise TrajectoryError("prompt_ids is empty")
        if check_tokens and not self._tokens_consistent():
            self._raise_first_inconsistency()

    def _tokens_consistent(self) -> bool:
        """The per-token rules, checked with C-level iteration (the common, valid case)."""
        mask, versions = self.response_mask, self.response_versions
        if not set(mask) <= {0, 1}:
            return False
        env = list(map(operator.not_, mask))
        masked_versions_ok = set(compress(versions, env)) <= {ENV_TOKEN_VERSION}
        masked_logprobs_ok = not any(compress(self.response_logprobs, env))
        model_versions_ok = min(compress(versions, mask), default=0) >= 0
        return masked_versions_ok and masked_logprobs_ok and model_versions_ok

    def _raise_first_inconsistency(self) -> None:
        for i, (m, lp, v) in enumerate(
            zip(self.response_mask, self.response_logprobs, self.response_versions, strict=True)
        ):
            if m not in (0, 1):
                raise TrajectoryError(f"response_mask[{i}] = {m!r}, expected 0 or 1")
            if m == 0 and (lp != 0.0 or v != ENV_TOKEN_VERSION):
                raise TrajectoryError(
                    f"masked token {i} must have logprob 0.0 and version {ENV_TOKEN_VERSION}, "
                    f"got {lp!r} and {v!r}"
                )
            if m == 1 and v < 0:
                raise TrajectoryError(f"model token {i} has no policy version ({v!r})")

    def truncate(self, max_response_length: int | None) -> None:
        """Cut the response to ``max_response_length`` tokens (None: keep it whole);
        ``extra["truncated"]`` says whether anything was cut."""
        cut = max_response_length is not None and len(self.response_ids) > max_response_length
        if cut:
            for values in (
                self.response_ids,
                self.response_mask,
                self.response_logprobs,
                self.response_versions,
            ):
                del values[max_response_length:]
        self.extra["truncated"] = cut

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among the model's tokens (None if it produced none)."""
        return min(compress(self.response_versions, self.response_mask), default=None)


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
        self.add_model_tokens(out.token_ids, out.logprobs, out.token_versions)

    def add_model_tokens(
        self, token_ids: list[int], logprobs: list[float], versions: list[int]
    ) -> None:
        """``add_model_turn`` for a turn recorded as its three lists (the gateway's calls)."""
        response_ids = self.response_ids
        start = len(response_ids)
        response_ids += token_ids
        # Only what build needs: the engine's output object and token list may go.
        self._model_turns.append((start, len(response_ids), logprobs, versions))
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
